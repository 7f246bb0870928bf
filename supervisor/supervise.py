"""One supervised job: the torchrun child, sampling, summaries, signals,
commands, and the watchdog's verdicts carried out.

Everything runs on one asyncio loop in the supervisor process; the only
blocking calls (NVML and psutil) run in a worker thread. Records go through
the hub (hub.py), which logs them, serves them to dashboards and shows them
to the watchdog (watchdog.py), whose verdicts come back here as alerts and
actions: collect stacks, restart the group, stop the job.

In a job of several nodes only node 0's supervisor judges (aggregator.py):
the others forward their records to it (uplink.py) and carry out what it
asks of their own ranks.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any, TextIO, cast

from ddptop.core import wire
from ddptop.core.model import goodput, summary
from ddptop.core.model.events import restart_text
from ddptop.core.policy import WatchPolicy
from ddptop.core.rundir import RunDir, own_log_tail, rank_log_tail, rank_log_written
from ddptop.core.wire import records
from ddptop.core.wire.records import NO_STACKS, CommandAction, RecordKind, asked_ranks
from ddptop.supervisor import duties, heap
from ddptop.supervisor.captures import Captures
from ddptop.supervisor.cluster import endpoints
from ddptop.supervisor.cluster.placement import Cluster
from ddptop.supervisor.cluster.role import role_of
from ddptop.supervisor.launching.torchrun import Torchrun
from ddptop.supervisor.launching.torchrun_probe import TORCHRUN_FAILED
from ddptop.supervisor.lifecycle import Lifecycle, RestartGate
from ddptop.supervisor.outlets import Outlets
from ddptop.supervisor.sampler import Sampler
from ddptop.supervisor.serving.hub import Hub
from ddptop.supervisor.serving.prometheus import PrometheusExporter
from ddptop.supervisor.watching import stacks
from ddptop.supervisor.watching.failures import LogTail, crash_excerpt
from ddptop.supervisor.watching.verdict import Verdict
from ddptop.supervisor.watching.watchdog import Watchdog

META = "meta.json"
WATCH_S = 0.25
"""Period of the watchdog's tick: how late a verdict may be carried out."""
CRASH_LOG_LINES = 20
CRASH_READ_LINES = 400
"""A fatal signal's report lists every thread's stack: read far enough back
to find where it starts (watchdog.crash_excerpt keeps what says something)."""
WATCHDOG_STOP_EXIT = 1
"""Exit status of a job the watchdog stopped (--on-nan/--on-desync/--on-hang stop);
a crash loop ends with the status of the failure that looped instead."""
SAMPLE_S = 1.0
FLUSH_S = 1.0
LOG_TAIL_LINES = 200
"""Lines of a rank's log a dashboard's detail screen is sent."""
STATE_S = 1.0
"""Period of the "summary" record that dashboards plot; printing has its own."""


class Supervisor:
    def __init__(
        self,
        run: RunDir,
        torchrun: Torchrun,
        sampler: Sampler,
        summary_every: float,
        watch: WatchPolicy | None = None,
        cluster: Cluster | None = None,
        prometheus: tuple[str, int] | None = None,
        out: TextIO = sys.stdout,
        outlets: Outlets | None = None,
    ) -> None:
        self.run = run
        self.torchrun = torchrun
        self.sampler = sampler
        self.summary_every = summary_every
        self.cluster = cluster or Cluster()
        self.prometheus_address = prometheus
        self.out = out
        self.outlets = outlets or Outlets()
        self.hub = Hub(run, self.on_command, observer=self._observe, outlets=self.outlets)
        self.state = self.hub.state
        self.record = self.hub.record
        self.watchdog = Watchdog(watch or WatchPolicy(), self.state, self._crash_log)
        self.role = role_of(self.cluster, self.hub, self.on_command, self._lost_aggregator)
        self.captures = Captures(self.record, self.hub.collector.tell_rank, self.role.command, self.role.owner, run.path / "profiles")
        self._stack_waiters: dict[int, asyncio.Future[None]] = {}
        self._tasks: set[asyncio.Future[None]] = set()
        self.exporter: PrometheusExporter | None = None
        self._verdicts: list[Verdict] = []
        self.lifecycle = Lifecycle()
        self.restarts = RestartGate()
        self._stopping: asyncio.Task[None] | None = None
        """torchrun being stopped, once a stop was asked."""
        self.meta: dict[str, Any] = {}
        """What meta.json says of the run (launch.py writes it first)."""
        self._rank_notes: set[str] = set()
        """What ranks noted (rank_note), each said once however many ranks say it."""
        for text in self.outlets.early:  # said already, on stderr: now for the event log too
            self.hub.note(text)
        self.outlets.notify = self._notice

    def on_command(self, command: records.Command) -> None:
        """A dashboard's request: stop the job, restart the group, kill a rank, a rank's stacks,
        log tail or profile, each by its own handler (COMMANDS)."""
        COMMANDS[command["action"]](self, command)

    def _source(self, command: records.Command) -> str:
        """Who asked, in words."""
        return (
            f"from the shell (ddptop {command['action'].replace('_rank', '')})" if command.get("origin") == "shell" else self.role.commander
        )

    def _stacks_asked(self, command: records.Command) -> None:
        """A dashboard's, of one rank; node 0's aggregator's, of this node's ranks."""
        self._in_background(self._stacks(asked_ranks(command, [])))

    def _log_tail_asked(self, command: records.Command) -> None:
        self._log_tail(command.get("rank"))

    def _profile_asked(self, command: records.Command) -> None:
        self.captures.ask(command, self.state)

    def _stop_asked(self, command: records.Command) -> None:
        self._note(None, f"stop requested {self._source(command)}")
        self._request_stop(signal.SIGTERM)

    def _kill_asked(self, command: records.Command) -> None:
        """A restart of the group, or a kill of one rank: killing ranks is how a restart is asked
        of torchrun, which restarts the whole worker group while its --max-restarts budget lasts."""
        restart = command["action"] == "restart"
        if not restart and command.get("rank") not in self.state.ranks:
            known = ",".join(map(str, sorted(self.state.ranks))) or "none yet"
            self.hub.note(f"no rank {command.get('rank')} in this job (ranks: {known})")
            return
        what = "restart of the group" if restart else f"kill of rank {command.get('rank')}"
        asked = f"{what} requested {self._source(command)}"
        killed = self._kill_ranks(None if restart else command.get("rank"))
        if killed:  # torchrun's record of the restart comes later, through this loop
            self.hub.stopping_for({"asked": asked})
        self._note(command.get("rank"), asked)
        if restart and not killed:
            # Between two attempts there is nothing to kill: the restart waits for the group to be up.
            self.restarts.ask_when_up(asked)
            self._note(None, "the group is between attempts: it restarts once its first rank is up")

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run work beside the loop's own tasks, held until it is done: the loop holds tasks weakly."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _log_tail(self, rank: int | None) -> None:
        """The end of a rank's own log to every dashboard: read here when the rank is this
        node's, asked of its node's supervisor otherwise (which sends it up the same way)."""
        state = self.state.ranks.get(rank) if rank is not None else None
        if state is None:
            return
        owner = self.role.owner(state.rank)
        if owner is not None:
            self.role.command(owner, {"type": "command", "action": "log_tail", "rank": state.rank})
            return
        style = str(self.state.meta.get("launch_style", "torchrun"))
        lines = own_log_tail(self.run.path, style, state.local_rank, state.restart, LOG_TAIL_LINES)
        self.hub.record({"type": "log_tail", "wall": time.time(), "rank": state.rank, "restart": state.restart, "lines": lines})

    def _kill_ranks(self, only: int | None = None) -> int:
        """SIGKILL this node's live ranks (or one): torchrun then restarts the group.

        Across nodes, torchrun's rendezvous restarts the other nodes' groups
        too. A rank of another node is killed by its own node's supervisor,
        on node 0's command. A pid comes from the rank's own hello: it is
        signalled only if it really is a process of this job, never whatever
        a frame names. Returns how many processes were killed here or asked of another node.
        """
        self.watchdog.expect_group_restart()
        owner = None if only is None else self.role.owner(only)
        if owner is not None and only is not None:
            self.role.command(owner, {"type": "command", "action": "kill_rank", "rank": only})
            return 1
        ours = self.torchrun.descendants()
        pids = {r.pid for r in self.state.ranks.values() if not r.exited and (only is None or r.rank == only)} & ours
        # A script that starts its own ranks fails when one is killed: that worker's death is ours too.
        # A whole group is torchrun's workers, also those that have not said hello yet (a group starting).
        workers = self.torchrun.workers()
        spawners = workers - {r.pid for r in self.state.ranks.values()}
        if only is None:
            pids |= workers
        self.watchdog.expect_deaths(pids | spawners)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        return len(pids)

    def _lost_aggregator(self) -> None:
        if not self.lifecycle.stopping:
            self._note(None, "lost node 0's supervisor; this node's ranks run on, unwatched")

    def _observe(self, record: wire.Record) -> None:
        """Every record the hub takes, as it takes it: what the supervisor does of its kind
        (SEEN), then the watchdog's look, then what waits for that look (JUDGED)."""
        kind = record["type"]
        self.captures.observe(record)
        if (seen := SEEN.get(kind)) is not None:
            seen(self, record)
        if self.role.judges:
            self._verdicts += self.watchdog.observe(record)
        if (judged := JUDGED.get(kind)) is not None:
            judged(self, record)

    def _agent_noted(self, record: records.AgentNote) -> None:
        text = record["text"] if record["node"] == 0 else f"node {record['node']}: {record['text']}"
        if self.role.judges:  # one notice in the job's log, however many nodes say it
            self.hub.note(text)
        self.say(text)
        if record["text"].startswith(TORCHRUN_FAILED):
            self.lifecycle.torchrun_failed = text

    def _rank_noted(self, record: records.RankNote) -> None:
        if record["text"] in self._rank_notes:
            return
        self._rank_notes.add(record["text"])  # every rank says it: once in the job's log
        if self.role.judges:
            self.hub.note(record["text"])
        self.say(record["text"])

    def _restart_held(self, record: records.GroupRestart) -> None:
        """Another node's restart too (its node field is torchrun's group rank, not ours): a probe
        lets through only its own number's go."""
        self.restarts.hold(record)

    def _stack_came(self, record: records.Stack) -> None:
        if (waiter := self._stack_waiters.pop(record["rank"], None)) is not None and not waiter.done():
            waiter.set_result(None)

    def _judge_now(self, record: records.GroupRestart | records.RankGone) -> None:
        """torchrun waits for the failure's judgement before it restarts: give it as soon as the
        failed attempt has said all it will (crash.py), not at the next tick."""
        if self.role.judges and self.watchdog.judging():
            self._in_background(self._watch())

    def _rank_up(self, record: records.RankHello) -> None:
        """A restart asked between attempts ends this attempt, once the watchdog has seen its hello."""
        if (asked := self.restarts.up()) is not None:
            self.hub.stopping_for({"asked": asked})
            self._kill_ranks()

    def _crash_log(self, failure: records.WorkerFailure) -> LogTail:
        """A failed rank's stderr tail, and when it was written, from this node's logs of the
        attempt the failure names: the rank's own hello of that attempt may not have been
        read yet, or ever (a rank that dies at once). Another node's rank: its
        exception record only."""
        if self.role.owner(failure["rank"]) is not None:
            return LogTail([])
        local_rank, restart = failure["local_rank"], failure["restart"]
        tail = rank_log_tail(self.run.path, local_rank, restart, CRASH_READ_LINES, streams=("stderr",))
        return LogTail(crash_excerpt(tail, CRASH_LOG_LINES), rank_log_written(self.run.path, local_rank, restart, streams=("stderr",)))

    async def _watch(self) -> None:
        self.captures.tick()
        verdicts, self._verdicts = self._verdicts + (self.watchdog.tick() if self.role.judges else []), []
        for verdict in verdicts:
            await self._carry_out(verdict)
        if self.restarts.held and not self.watchdog.judging() and not self.lifecycle.stopping:
            for held in self.restarts.release():
                self.say(restart_text(held, going=True))
                go: records.RestartGo = {"type": "restart_go", "restart": held["restart"]}
                if held.get("asked"):
                    go["now"] = True
                self.hub.collector.tell_agents(go)

    async def _carry_out(self, verdict: Verdict) -> None:
        """Alert first (log, dashboards, stderr), then stacks, then the action."""
        if verdict.stacks and not verdict.notice:
            verdict.text += f"; stacks in {self.run.path / 'stacks'}"
        if verdict.kind == "straggler" and verdict.ranks:
            others = [rank for rank in sorted(self.state.ranks) if rank not in verdict.ranks]
            compared = ",".join(map(str, [*verdict.ranks, *others[:1]]))
            verdict.text += f"; what differs: ddptop profile {self.run.id} --ranks {compared}"
        self.record(verdict.record())
        if verdict.notice:
            self.say(verdict.text)
            return
        self.say(f"ALERT {verdict.kind}: {verdict.text}")
        if verdict.action == "stop" or verdict.kind == "crash":
            self.lifecycle.explained_by(f"{verdict.kind}: {verdict.text}", stops=verdict.action == "stop")
        if verdict.stacks:
            await self._stacks(verdict.stacks)
        if verdict.action == "restart":
            self._note(None, f"restarting the worker group after the {verdict.kind} alert")
            self.hub.stopping_for({"ordered": verdict.kind})
            self._kill_ranks()
        elif verdict.action == "stop":
            self._note(None, f"stopping the job after the {verdict.kind} alert")
            self._request_stop(signal.SIGTERM, verdict.details.get("exit_status", WATCHDOG_STOP_EXIT))

    async def _stacks(self, ranks: list[int]) -> None:
        """The ranks' stacks now: this node's dumped here, the other nodes' asked of their supervisors."""
        ours = self.torchrun.descendants()
        await asyncio.gather(*(self._collect_stack(rank, ours) for rank in ranks))
        await self._remote_stacks(ranks)

    async def _remote_stacks(self, ranks: list[int]) -> None:
        """Ask other nodes' supervisors for their ranks' stacks; wait (bounded) for them to arrive."""
        loop = asyncio.get_running_loop()
        waiting = []
        by_node: dict[int, list[int]] = {}
        for rank in ranks:
            if (node := self.role.owner(rank)) is not None:
                by_node.setdefault(node, []).append(rank)
                waiting.append(self._stack_waiters.setdefault(rank, loop.create_future()))
        for node, node_ranks in by_node.items():
            self.role.command(node, {"type": "command", "action": "stacks", "ranks": node_ranks})
        if waiting:
            await asyncio.wait(waiting, timeout=stacks.PY_SPY_TIMEOUT_S + 1.0)

    async def _collect_stack(self, rank: int, ours: set[int]) -> None:
        """Ask one rank for its stacks; ours holds the job's pids (see _kill_ranks)."""
        state = self.state.ranks.get(rank)
        if state is None or state.pid not in ours:
            return
        got = await stacks.dump(self.run.raw_stacks_path, rank, state.pid)
        if got is None:
            self._note(rank, f"rank {rank} gave no stack dump: {stacks.why_none(state.pid)}", kind=NO_STACKS)
            return
        source, text = got
        self.outlets.write("the stack files", stacks.keep, self.run.stacks_path, rank, state.pid, source, text)
        self.record({"type": "stack", "rank": rank, "wall": time.time(), "source": source, "text": text})

    def _note(self, rank: int | None, text: str, kind: str | None = None) -> None:
        action: records.Action = {"type": "action", "wall": time.time(), "text": text}
        if rank is not None:
            action["rank"] = rank
        if kind:
            action["kind"] = kind
        self.record(action)
        self.say(text)

    async def main(self, meta: dict[str, Any]) -> int:
        """Run the job to its end; return the exit status for `ddptop launch`."""
        loop = asyncio.get_running_loop()
        self.meta = {key: value for key, value in meta.items() if key != "wall"}
        await self.hub.start()
        if self.cluster.listener is not None:
            await self.hub.collector.start_tcp(self.cluster.listener, self.cluster.token)
        background = await self.role.start()
        if self.prometheus_address is not None:
            self._start_exporter(*self.prometheus_address)
        self.record(cast(records.Run, {"type": "run", **meta}))  # meta.json's fields: launch.py writes what Run declares
        await self.torchrun.start()
        self.lifecycle.started()
        self._update_meta(torchrun_pid=self.torchrun.pid)
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(signum, self._on_signal, signum)
        periodic = [
            *background,
            *(
                asyncio.create_task(duties.every(period, name, action, self._notice))
                for period, name, action in (
                    (SAMPLE_S, "sampling of the ranks' processes and GPUs", self._sample),
                    (STATE_S, "per-second summary", self._record_totals),
                    (self.summary_every, "summary line", self._periodic_summary),
                    (FLUSH_S, "event log flush", self._flush),
                    (FLUSH_S, "state snapshot", self._keep_state),
                    (WATCH_S, "watchdog", self._watch),
                    (heap.TRIM_S, "heap trim", self._trim_heap),
                )
            ),
        ]
        code = await self.torchrun.wait()
        for task in periodic:
            task.cancel()
        await asyncio.gather(*periodic, return_exceptions=True)
        await self.hub.collector.ranks_done()
        for verdict in self._verdicts + self.watchdog.tick(final=True):
            verdict.action = "none"  # the job is over: alert only
            await self._carry_out(verdict)
        outcome = self.lifecycle.end(code)
        self.role.close()
        # meta.json first, then the exit record: whoever is told the job ended (`ddptop stop`, a
        # dashboard) finds its run ended too. The record closes the log, the viewers, the
        # Prometheus server and the state's snapshot after it, which take seconds.
        ended = time.time()
        split = self.state.goodput.split(ended)
        self._update_meta(
            state=outcome.state,
            ended=ended,
            exit_code=outcome.code,
            steps=self.state.totals().steps_done,
            why=self.lifecycle.failed_why(outcome.code, bool(self.state.ranks)) if outcome.state == "failed" else None,
            goodput=split,
        )
        await self.hub.finish(outcome.code, outcome.signal, ended)
        if self.exporter is not None:
            self.exporter.stop()
        await self._print_summary()
        if split is not None:
            self.outlets.line(self.out, f"ddptop: {goodput.text(split)}")
        self.outlets.line(self.out, f"ddptop: job {outcome.state} (exit {outcome.code}); run directory {self.run.path}")
        return outcome.code

    def _on_signal(self, signum: int) -> None:
        """SIGINT or SIGTERM: stop the job in order; a second one: kill it now.

        SIGHUP is the terminal going away (an ssh session dropped under
        --headless): the job goes on, watched, and what cannot be printed
        any more is dropped (outlets.py). It is said, in case anyone reads.
        """
        if signum == signal.SIGHUP:
            self.hub.note(f"SIGHUP: the terminal is gone; the job goes on (SIGTERM to pid {os.getpid()} stops it)")
            self.say(f"SIGHUP: the terminal is gone; the job goes on (SIGTERM to pid {os.getpid()} stops it)")
            return
        if not self.lifecycle.stopping:
            self.say(f"{signal.Signals(signum).name}: stopping the job")
        self._request_stop(signum)

    def _request_stop(self, signum: int, code: int | None = None) -> None:
        """Stop this node's torchrun (the watchdog's stop says the exit status, code); node 0's
        supervisor stops every node's. Asked again: kill torchrun now."""
        if self.lifecycle.stop(signum, code):
            self._stopping = asyncio.create_task(self.torchrun.stop())
            self.role.command_all({"type": "command", "action": "stop"})
        elif self.torchrun.proc is not None and self.torchrun.proc.returncode is None:
            self.torchrun.proc.kill()

    async def _sample(self) -> None:
        """This node's rank processes and GPUs (another node's ranks are sampled there)."""
        ours = {rank: state for rank, state in self.state.ranks.items() if state.pid and self.role.owner(rank) is None}
        pids = {rank: state.pid for rank, state in ours.items()}
        gpus = {rank: state.gpu_uuid for rank, state in ours.items() if state.gpu_uuid}
        record = await asyncio.to_thread(self.sampler.sample, pids, gpus)
        self.record({**record, "node": self.cluster.node})

    def _start_exporter(self, host: str, port: int) -> None:
        """The address was checked before the job started; a port taken since then costs the endpoint only."""
        exporter = PrometheusExporter(self.state, self.cluster.node)
        try:
            exporter.start(host, port)
        except OSError as exc:
            self._note(None, f"no Prometheus endpoint: cannot listen on {endpoints.text(host, port)}: {exc.strerror or exc}")
            return
        self.exporter = exporter
        self._update_meta(prometheus=endpoints.text(host, exporter.port or port))

    async def _record_totals(self) -> None:
        self.hub.record_totals()
        if self.exporter is not None:
            self.exporter.refresh()

    async def _periodic_summary(self) -> None:
        """A summary line while a rank runs. Once every rank has exited (the job's end, or a
        restart's gap, which its own notice tells), a line would repeat the last one: at the end,
        the final line follows it within the ranks' teardown."""
        if self.state.running():
            await self._print_summary()

    async def _print_summary(self) -> None:
        self.outlets.line(self.out, summary.line(self.state.totals(), time.time() - self.state.started))

    async def _flush(self) -> None:
        self.hub.flush()
        if META in self.outlets.down:  # written whole each time: once there is room, it is all there
            self._update_meta()

    async def _keep_state(self) -> None:
        self.hub.keep_state()

    def _update_meta(self, **changes: Any) -> None:
        """meta.json from the supervisor's own copy: a file it could not write or read back is no loss."""
        self.meta.update(changes)
        self.outlets.write(META, self.run.write_meta, self.meta)

    def say(self, text: str) -> None:
        """A line for the user on stderr, as every alert, notice and action is said."""
        self.outlets.line(sys.stderr, f"ddptop: {text}")

    def _notice(self, text: str) -> None:
        """The supervisor's own trouble (an outlet failed or came back, a periodic duty raised):
        a notice for the log and every dashboard, and a line."""
        self.hub.note(text)
        self.say(text)

    async def _trim_heap(self) -> None:
        heap.trim()


COMMANDS: dict[CommandAction, Callable[[Supervisor, records.Command], None]] = {
    "stacks": Supervisor._stacks_asked,
    "log_tail": Supervisor._log_tail_asked,
    "profile": Supervisor._profile_asked,
    "stop": Supervisor._stop_asked,
    "restart": Supervisor._kill_asked,
    "kill_rank": Supervisor._kill_asked,
}
"""What each command a dashboard (or node 0's aggregator) may send does: one handler an action."""

# Each handler takes its kind's own record (records.py): the tables' values take Any for it.
SEEN: dict[RecordKind, Callable[[Supervisor, Any], None]] = {
    "agent_note": Supervisor._agent_noted,
    "rank_note": Supervisor._rank_noted,
    "group_restart": Supervisor._restart_held,
    "stack": Supervisor._stack_came,
}
"""What the supervisor does of a record, by its kind, before the watchdog looks at it."""

JUDGED: dict[RecordKind, Callable[[Supervisor, Any], None]] = {
    "group_restart": Supervisor._judge_now,
    "rank_gone": Supervisor._judge_now,
    "rank_hello": Supervisor._rank_up,
}
"""What waits for the watchdog's look at a record, by its kind."""
