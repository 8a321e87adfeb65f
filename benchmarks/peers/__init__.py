"""The peers benchmark: the job (job.py) and the scripts that run it; benchmarks/peers_bench.py starts them."""
