"""Create the Accelerator and say plainly what hardware and precision the run really uses.

accelerate 1.15 has silent fallbacks: fp16 on a CPU trains in fp32, a GPU config on a machine
without a GPU trains on the CPU, and a MULTI_GPU launch on a CPU machine starts unsynchronised
copies unless the Accelerator is created with cpu=True. This module turns each into a visible
warning (recorded in summary.json) or, where going on would mislead, an error.
"""

from __future__ import annotations

import ctypes
import datetime
import functools
import os
import shutil
import signal
import sys
import sysconfig
from pathlib import Path
from typing import Any

import accelerate.optimizer
import torch
from accelerate import Accelerator
from accelerate.utils import (
    DataLoaderConfiguration,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    DistributedType,
    InitProcessGroupKwargs,
    ProjectConfiguration,
)

from .config import ConfigError, LaunchError, TrainConfig

TRACKER_PACKAGES = {"tensorboard": "tensorboard", "trackio": "trackio", "wandb": "wandb", "mlflow": "mlflow"}


def die_with_launcher() -> None:
    """torchrun starts each rank in a session of its own: if the launcher is SIGKILLed, its ranks
    would train on as orphans (and keep writing the run folder). Ask Linux to kill us with it."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    launcher = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != launcher:  # the launcher died before prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)


M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def glibc_mallopt():
    """glibc's mallopt, or None where the C library is another (macOS, musl)."""
    libc = ctypes.CDLL(None)
    return getattr(libc, "mallopt", None) if hasattr(libc, "gnu_get_libc_version") else None


def set_host_malloc(cfg: TrainConfig) -> dict:
    """--mmap-threshold-kb: blocks that large are mapped apart and return to the system when freed. glibc's own
    threshold rises to the size of each large block freed, so a loop's freed activations stay in its free lists and
    count in the peak resident memory. Set once, before anything large is allocated."""
    kb = cfg.run.mmap_threshold_kb
    if kb:
        mallopt = glibc_mallopt()
        if mallopt is None:
            raise ConfigError(f"--mmap-threshold-kb {kb}: needs glibc's malloc (Linux); this C library has no mallopt")
        if kb > 32768 or not mallopt(M_MMAP_THRESHOLD, kb * 1024):  # glibc's limit on 64-bit machines: 32 MB
            raise ConfigError(f"--mmap-threshold-kb {kb}: glibc takes at most 32768 (32 MB) on a 64-bit machine")
    return {"host_mmap_threshold_kb": kb or None}


def make_accelerator(cfg: TrainConfig) -> Accelerator:
    die_with_launcher()
    # accelerate 1.15's optimizer.step() looks for the lomo_optim package twice per step, uncached
    # (an importlib find_spec each time): 0.1 ms of a 2 ms step on the default model. The answer
    # cannot change while we run, so ask once.
    if not hasattr(accelerate.optimizer.is_lomo_available, "cache_info"):
        accelerate.optimizer.is_lomo_available = functools.cache(accelerate.optimizer.is_lomo_available)
    # torch.compile comes from the accelerate config (dynamo_config); if the machine cannot compile,
    # run eager rather than fail with a long traceback at the first step (describe() says so).
    eager = {"dynamo_backend": "no"} if compile_problem() else {}
    if cfg.run.ddp_comm_hook == "bf16" and not torch.cuda.is_available():
        raise ConfigError(
            "--ddp-comm-hook bf16: torch's bf16 all-reduce needs NCCL on CUDA GPUs; on CPUs (gloo) use fp16 or none"
        )
    return Accelerator(
        # Experiment trackers, written by the main process; tensorboard logs under <output-dir>/trackers/<run name>.
        log_with=trackers(cfg),
        project_config=ProjectConfiguration(
            project_dir=cfg.run.output_dir, logging_dir=os.path.join(cfg.run.output_dir, "trackers")
        ),
        # Without CUDA, cpu=True is what makes a multi-process launch join one gloo group
        # (otherwise each process trains alone); with CUDA the config decides.
        cpu=not torch.cuda.is_available(),
        gradient_accumulation_steps=cfg.optim.grad_accum_steps,
        # The seedable sampler makes the shuffle order a function of (seed, epoch) on every rank,
        # which is what lets runs be compared across process counts and resumed exactly.
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=cfg.run.seed),
        # A collective that never completes (a rank stuck or gone) fails the job after this long
        # instead of hanging it; long enough for the main process to prepare a big dataset first.
        kwargs_handlers=[
            InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=cfg.run.collective_timeout)),
            ddp_kwargs(cfg),
        ],
        **eager,
    )


def prepare(accelerator: Accelerator, *objects):
    """accelerator.prepare, and for FSDP2 the autocast it leaves out. accelerate 1.15 gives every prepared model a
    forward under autocast with float32 outputs, except an FSDP2 one (its FSDP2 path skips prepare_model): in bf16
    or fp16 that model computes in its sharded weights' dtype alone, so any float32 tensor it makes (a buffer, the
    default MLP's standardisation) meets half-precision weights, "mat1 and mat2 must have the same dtype" (seen
    on an H200). Here it gets the forward the others get."""
    model, *rest = accelerator.prepare(*objects)
    if accelerator.is_fsdp2 and accelerator.native_amp:
        from accelerate.utils.modeling import get_mixed_precision_context_manager

        with_autocast(model, get_mixed_precision_context_manager(True, accelerator.autocast_handler))
    return model, *rest


def with_autocast(model: torch.nn.Module, autocast) -> None:
    """model's forward under the autocast context `autocast`, its outputs in float32, as accelerate wraps it
    (unwrap_model and get_state_dict take it off again through _original_forward)."""
    from types import MethodType

    from accelerate.utils import convert_outputs_to_fp32

    own: Any = model.forward  # a bound method: its function is wrapped and bound again, as accelerate does
    model._original_forward = own  # type: ignore[assignment]
    model.forward = MethodType(convert_outputs_to_fp32(autocast(own.__func__)), model)  # type: ignore[method-assign]


def ddp_kwargs(cfg: TrainConfig) -> DistributedDataParallelKwargs:
    """How DDP all-reduces gradients (docs/benchmarks.md, "DDP options", has what each setting buys)."""
    hooks = {
        "none": DDPCommunicationHookType.NO,
        "fp16": DDPCommunicationHookType.FP16,
        "bf16": DDPCommunicationHookType.BF16,
    }
    return DistributedDataParallelKwargs(
        # The gradients become views into DDP's all-reduce buckets: one copy fewer per step, and one
        # gradient-sized buffer less memory. The numbers are unchanged.
        gradient_as_bucket_view=True,
        # Smaller buckets on CPUs: a 784-1024-1024 MLP's gradients then go out in three buckets, the
        # second layer's all-reduced while the first layer's backward runs (25 MB makes it wait).
        bucket_cap_mb=cfg.run.ddp_bucket_mb or (25 if torch.cuda.is_available() else 5),
        comm_hook=hooks[cfg.run.ddp_comm_hook],  # opt-in: 16-bit gradients on the wire change the numbers
    )


def trackers(cfg: TrainConfig):
    """accelerate's log_with for --report-to; a tracker that is not installed is one line naming its extra."""
    if cfg.run.report_to == "none":
        return None
    if cfg.run.report_to == "all":
        return "all"
    import accelerate.utils as available

    if not getattr(available, f"is_{cfg.run.report_to}_available")():
        raise ConfigError(
            f"--report-to {cfg.run.report_to}: the {TRACKER_PACKAGES[cfg.run.report_to]} package is not installed "
            f"(pip install 'anytrain[{cfg.run.report_to}]')"
        )
    return [cfg.run.report_to]


def requested_compile_backend() -> str:
    """The torch.compile backend the accelerate config asks for ('no' when none)."""
    return os.environ.get("ACCELERATE_DYNAMO_BACKEND", "no").lower()


def compile_problem() -> str | None:
    """Why the requested inductor compilation cannot work on this machine, or None."""
    if requested_compile_backend() != "inductor":
        return None
    if torch.cuda.is_available():
        from torch.utils._triton import has_triton

        return None if has_triton() else "TorchInductor on the GPU needs the triton package, which is not installed"
    compiler = os.environ.get("CXX", "g++")
    if shutil.which(compiler) is None:
        return f"TorchInductor on the CPU needs a C++ compiler and '{compiler}' was not found (install g++ or set CXX)"
    if not Path(sysconfig.get_paths()["include"], "Python.h").exists():
        return "TorchInductor on the CPU needs the Python development headers (Python.h), which are not installed"
    return None


def restart_problem() -> str | None:
    """Why torchrun's in-place restarts (--max_restarts) may not reconnect the ranks, or None.

    By default (torch 2.13) the launcher keeps one TCP store for the whole job and every attempt's
    ranks post their gloo/NCCL addresses under the same keys there, so a restarted rank can read a
    killed rank's address: "Connection refused", or both ranks waiting in connectFullMesh until
    --collective-timeout. TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in the launcher's environment gives
    each attempt a fresh store (c10d rendezvous only; the static one always shares its store)."""
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    if restarts == 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    return (
        f"--max_restarts {restarts}: the launcher shares one store between attempts, so a restarted rank can read the "
        "previous attempt's addresses and fail to reconnect. Launch with --rdzv_backend c10d and "
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in the launcher's environment (as examples/slurm/train.sbatch does)"
    )


def asked_for_several_cpu_processes() -> bool:
    """accelerate's single-process launcher exports MASTER_ADDR only when more than one process
    (or machine) was asked for; a CPU launch that got there started one process all the same."""
    launcher_env = os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true" and "MASTER_ADDR" in os.environ
    return launcher_env and not any(k in os.environ for k in ("RANK", "WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE"))


def launcher_num_processes() -> int | None:
    """The process count given to the `accelerate launch` that started us (its flag, else its config
    file); the single-process launcher passes it on to no one. None when it cannot be told."""
    try:
        import psutil  # an accelerate dependency
        from accelerate.commands.config.config_args import load_config_from_file
        from accelerate.commands.launch import launch_command_parser

        launcher = psutil.Process(os.getppid())
        argv = launcher.cmdline()
        start = next(i for i, a in enumerate(argv) if a == "launch" or a.endswith("accelerate.commands.launch")) + 1
        args, _ = launch_command_parser().parse_known_args(argv[start:])
        if args.num_processes is None:
            config_file = args.config_file and os.path.join(launcher.cwd(), args.config_file)
            args.num_processes = load_config_from_file(config_file).num_processes
        return int(args.num_processes)
    except Exception:  # noqa: BLE001 - only a better wording is at stake
        return None


def describe(accelerator: Accelerator) -> dict:
    """The effective scenario, with a warning for every request that could not be honoured."""
    state = accelerator.state
    warnings: list[str] = []
    requested_precision = state.mixed_precision
    precision = {"no": "fp32", "fp16": "fp16", "bf16": "bf16"}.get(requested_precision, requested_precision)
    if requested_precision == "fp16" and accelerator.scaler is None:
        precision = "fp32"
        warnings.append(f"fp16 was requested but is not available on {accelerator.device.type}: training in fp32")
    elif requested_precision == "bf16" and not accelerator.native_amp:
        precision = "fp32"
        warnings.append(f"bf16 was requested but is not available on {accelerator.device.type}: training in fp32")
    problem = compile_problem()
    if problem:
        warnings.append(f"torch.compile ({requested_compile_backend()}) was requested but {problem}: running eager")
    compiled = str(state.dynamo_plugin.backend.value).lower() if state.dynamo_plugin.backend.value != "NO" else None
    if os.environ.get("ACCELERATE_USE_CPU", "").lower() == "false" and not torch.cuda.is_available():
        warnings.append("the accelerate config asks for GPUs but this machine has no CUDA device: training on the CPU")
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true" and state.distributed_type != DistributedType.FSDP:
        warnings.append(
            f"FSDP was requested but runs only on GPUs: training with {state.distributed_type.value} (every rank "
            "holds the whole model)"
        )
    restart = restart_problem()
    if restart:
        warnings.append(restart)
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched != accelerator.num_processes:
        raise LaunchError(
            f"{launched} processes were launched but they joined a group of {accelerator.num_processes}: "
            "each would train alone. Launch with `accelerate launch --config_file accelerate_configs/multi_cpu.yaml` "
            "on CPU or accelerate_configs/multi_gpu.yaml on GPUs."
        )
    if accelerator.num_processes == 1 and asked_for_several_cpu_processes():
        asked = launcher_num_processes()
        warnings.append(
            f"{asked or 'several'} processes were asked for but 1 started: accelerate 1.15 starts only one for "
            "distributed_type MULTI_CPU (or --cpu --num_processes N), so this trains with 1 process. For 2 CPU ranks "
            "use "
            "`accelerate launch --config_file accelerate_configs/multi_cpu.yaml`"
        )
    backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else None
    handler = getattr(accelerator, "ddp_handler", None)
    hook = handler.comm_hook.value.lower() if handler is not None and accelerator.num_processes > 1 else "no"
    return {
        "distributed_type": str(state.distributed_type).split(".")[-1],
        "backend": backend,
        "num_processes": accelerator.num_processes,
        "device": str(accelerator.device),
        "device_name": torch.cuda.get_device_name(accelerator.device) if accelerator.device.type == "cuda" else "cpu",
        "mixed_precision_requested": requested_precision,
        "mixed_precision": precision,
        "cpu_threads_per_process": torch.get_num_threads(),
        "compile": compiled,
        "gradient_all_reduce": None if backend is None else "fp32" if hook == "no" else hook,
        "ddp_bucket_mb": handler.bucket_cap_mb if handler is not None and backend is not None else None,
        "torch": torch.__version__,
        "warnings": warnings,
    }


def format_scenario(s: dict) -> str:
    group = f"{s['distributed_type']}" + (f" over {s['backend']}" if s["backend"] else "")
    line = (
        f"anytrain: {group}, {s['num_processes']} process(es), device {s['device']} ({s['device_name']}), "
        f"precision {s['mixed_precision']}, {s['cpu_threads_per_process']} CPU thread(s) per process"
        + (f", torch.compile ({s['compile']})" if s.get("compile") else "")
        + (
            f", gradients all-reduced in {s['gradient_all_reduce']}"
            if s.get("gradient_all_reduce") not in (None, "fp32")
            else ""
        )
    )
    if s.get("host_mmap_threshold_kb"):
        line += f", host blocks of {s['host_mmap_threshold_kb']} KB or more mapped apart (--mmap-threshold-kb)"
    return "\n".join([line] + [f"anytrain: WARNING: {w}" for w in s["warnings"]])
