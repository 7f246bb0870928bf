32378 python 1835
32379 python 10
32380 gloo_tcp_loop 3
32381 pt_gloo_runloop 15
32382 pt_gloo_runloop 16
32383 python 1661
