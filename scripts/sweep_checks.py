"""What the sweep scripts check before they run weft-bench: a build that holds
weftrun and weft-bench, and a GPU. Each check exits through the caller's
`fail(message)`, so the message carries the script's name."""
import os
import shutil
import subprocess


def require_build(build, fail):
    """Exits 1 with how to build unless BUILD holds weftrun and weft-bench."""
    missing = [name for name in ("weftrun", "weft-bench") if not os.access(os.path.join(build, name), os.X_OK)]
    if missing:
        fail(f"{build} has no {' and no '.join(missing)}: build them first with `bash scripts/build.sh` "
             f"(it builds into build/; WEFT_BUILD_DIR=DIR bash scripts/build.sh for another folder), "
             f"or pass --build DIR")


def count_gpus(fail):
    """The GPUs 'nvidia-smi -L' lists; exits 1 with a plain message when there are none."""
    smi = shutil.which("nvidia-smi")
    why = None
    if not smi:
        why = "nvidia-smi is not installed"
    else:
        try:
            p = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
            n = sum(1 for line in p.stdout.splitlines() if line.startswith("GPU "))
            if n > 0:
                return n
            why = f"'nvidia-smi -L' lists none ({(p.stderr or p.stdout).strip() or f'exit status {p.returncode}'})"
        except (OSError, subprocess.SubprocessError) as e:
            why = f"'nvidia-smi -L' failed ({e})"
    fail(f"no NVIDIA GPU found: {why}. This sweep runs weft-bench on GPUs; "
         "on a machine without one, re-plot saved results with --from-json FILE ...")
