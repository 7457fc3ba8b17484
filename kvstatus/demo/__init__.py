"""The simulated PD cluster behind ``kvstatus demo``: its workload, baselines and embedded redis-server."""
