"""The sender against real Unix sockets: delivery, a stalled and a closed listener."""

import socket
import threading

import pytest
from builders import hello
from support import bound_unix, received, wait_for

from ddptop.trainer.sender import Sender

HELLO = hello(0)


def heartbeat() -> dict:
    return {"type": "heartbeat", "rank": 0, "wall": 0.0, "phase": "data", "step": 0, "dropped": 0}


def step(i: int) -> dict:
    return {"type": "step", "rank": 0, "step": i, "wall": 0.0, "step_ms": 1.0}


@pytest.fixture
def listener(tmp_path):
    path = tmp_path / "s"
    server = bound_unix(path)
    server.listen()
    yield server, f"unix:{path}"
    server.close()


def test_records_arrive_in_order_after_the_hello(listener):
    server, address = listener
    frames: list = []
    sender = Sender(address, HELLO, heartbeat)
    sender.start()
    conn, _ = server.accept()
    reader = threading.Thread(target=frames.extend, args=(received(conn),))
    reader.start()
    for i in range(500):
        sender.put(step(i))
    sender.close(timeout=5)
    reader.join(5)
    assert frames[0] == HELLO
    steps = [item["step"] for f in frames[1:] for item in f["items"] if item["type"] == "step"]
    assert steps == list(range(500))
    assert sender.dropped == 0


def test_step_records_are_built_on_the_senders_thread_and_arrive_with_the_next_batch(listener):
    """The training thread only closes steps; the sender's thread builds their
    records before each batch (steps.py), all but the last step."""
    from ddptop.trainer.steps import StepTracker

    server, address = listener
    frames: list = []
    sender: Sender
    tracker = StepTracker(0, emit=lambda record: sender.put(record))
    builders: set[str] = set()

    def collect() -> None:
        builders.add(threading.current_thread().name)
        tracker.build()

    sender = Sender(address, HELLO, heartbeat, collect=collect)
    for _ in range(3):
        tracker.forward_begin(8)
        tracker.optimizer_begin({})
        tracker.optimizer_end({})
    sender.start()
    conn, _ = server.accept()
    reader = threading.Thread(target=frames.extend, args=(received(conn),))
    reader.start()

    def steps_sent() -> list[int]:
        return [item["step"] for f in list(frames[1:]) for item in f["items"] if item["type"] == "step"]

    wait_for(lambda: steps_sent() == [0, 1], 10, "the sealed steps to be sent without the training thread")
    sender.close(timeout=5)
    reader.join(5)
    assert builders == {"ddptop-sender"}


def test_a_stalled_listener_costs_drops_not_waiting(listener):
    _server, address = listener  # accepts (backlog) but never reads
    sender = Sender(address, HELLO, heartbeat, queue_max=1000)
    sender.start()
    big = {**step(0), "loss": 1.0}
    for _i in range(200_000):
        sender.put(big)
    wait_for(lambda: sender.dropped > 0, 10, "drops to be counted while the listener stalls")
    sender.close(timeout=3)


def test_a_listener_that_goes_away_mid_run_is_survived(listener):
    server, address = listener
    sender = Sender(address, HELLO, heartbeat)
    sender.start()
    conn, _ = server.accept()
    conn.close()
    server.close()

    def keep_training() -> bool:
        sender.put(step(0))
        return sender.dropped > 0

    wait_for(keep_training, 10, "drops to be counted after the listener closed", interval=0.001)
    assert sender.dropped > 0
    sender.close(timeout=3)


def test_a_supervisor_that_hangs_up_costs_drops_until_the_rank_reconnects(listener):
    """Hanging up (shutdown, so the rank's sends still succeed) is noticed by reading,
    and a rank that noticed so waits before reconnecting, as after a failed send:
    what it made meanwhile is counted, not silently sent to a fresh connection."""
    server, address = listener
    sender = Sender(address, HELLO, heartbeat)
    sender.start()
    training = threading.Event()

    def train() -> None:
        while not training.wait(0.001):
            sender.put(step(0))

    trainer = threading.Thread(target=train)
    trainer.start()
    server.settimeout(10)
    first, _ = server.accept()
    first.shutdown(socket.SHUT_WR)
    second, _ = server.accept()
    training.set()
    trainer.join(5)
    assert sender.dropped > 0
    sender.close(timeout=3)
    first.close()
    second.close()


def test_no_listener_at_all(tmp_path):
    sender = Sender(f"unix:{tmp_path / 'missing'}", HELLO, heartbeat)
    sender.start()
    sender.put(step(0))
    wait_for(lambda: sender.dropped >= 1, 5, "the unsendable record to be counted")
    sender.close(timeout=3)


def test_a_socket_path_longer_than_af_unix_allows(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = deep / "sock"
    assert len(str(path)) > 108
    server = bound_unix(path)  # through unixpath, as the supervisor binds it
    server.listen()
    assert path.exists()
    frames: list = []
    sender = Sender(f"unix:{path}", HELLO, heartbeat)
    sender.start()
    conn, _ = server.accept()
    sender.close(timeout=3)
    frames += received(conn)
    server.close()
    assert frames[0] == HELLO
