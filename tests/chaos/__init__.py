"""The fault harness: a real cluster in network namespaces, real faults, a history checker.

Modules, injectors apart from checkers:
  history.py   the recorded history (pure data, JSON in and out)
  checker.py   history in, violations and figures out (pure, unit-tested)
  schedule.py  the fault schedule, a pure function of the seed
  net.py       namespaces, veth/bridge, nftables cuts, tc netem
  cluster.py   the controller and broker processes, their filesystems and clocks
  workload.py  idempotent acks=all producers, tailing consumers, the final read-back
  replicas.py  segment files decoded after every process stopped
  runner.py    one run: set up, drive the schedule, heal, read back, check, tear down
  main.py      `scripts/chaos`: arguments, capability checks, the summary
"""
