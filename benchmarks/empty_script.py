"""The reference for launch time: `accelerate launch --config_file accelerate_configs/cpu.yaml
benchmarks/empty_script.py` does everything a launch does (accelerate's CLI, config parsing, a fresh
interpreter) and nothing else."""
