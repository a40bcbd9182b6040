# lit configuration for sp's pass and tool tests (textual IR + FileCheck).
import os
import lit.formats

config.name = "sp"
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".sp", ".test"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(os.path.dirname(config.sp_bin_dir), "tests", "lit-out")
config.excludes = ["Inputs", "lit.cfg.py", "lit.site.cfg.py.in"]

path = os.pathsep.join([config.sp_bin_dir, config.llvm_tools_dir,
                        config.environment.get("PATH", os.environ.get("PATH", ""))])
config.environment["PATH"] = path
# OpenBLAS's kernel choice, so that the numerical tests can be rerun with
# another one (OPENBLAS_CORETYPE=Haswell, SkylakeX, Sandybridge, ...).
if "OPENBLAS_CORETYPE" in os.environ:
    config.environment["OPENBLAS_CORETYPE"] = os.environ["OPENBLAS_CORETYPE"]
config.substitutions.append(("%python", config.python))
config.substitutions.append(("%models", os.path.join(config.sp_source_dir, "models")))
config.substitutions.append(("%inputs", os.path.join(config.sp_source_dir, "tests", "lit", "Inputs")))

# The slow tool tests (each half a minute or more on 2 cores; REQUIRES:
# slow) run unless SP_QUICK=1: tools/dev.sh test leaves them to check.
if os.environ.get("SP_QUICK") != "1":
    config.available_features.add("slow")

# MPI runs: mpirun with what CI needs (root, 2 cores, containers).
if config.mpiexec:
    config.available_features.add("mpi")
    config.environment["OMPI_MCA_btl_vader_single_copy_mechanism"] = "none"
    flags = " --oversubscribe" + (" --allow-run-as-root" if os.geteuid() == 0 else "")
    config.substitutions.append(("%mpirun", config.mpiexec + flags))

# A GPU this machine can use (nvidia-smi lists one): the tests of what
# sp-run --device cuda says without one are unsupported there.
import shutil
import subprocess
if shutil.which("nvidia-smi"):
    try:
        if subprocess.run(["nvidia-smi", "-L"], capture_output=True,
                          timeout=30).stdout.strip():
            config.available_features.add("cuda-device")
    except (OSError, subprocess.SubprocessError):
        pass
