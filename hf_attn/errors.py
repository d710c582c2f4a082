"""The project's user-facing error class: bad input that the user can fix.

Messages are one line that names the value, the limit or valid choices, and the fix. The CLI prints them as
``hf-attn: error: <message>`` and exits with code 2.
"""


class HfAttnInputError(ValueError):
    """Bad input (file, column, language code, output directory, flag value): the message says how to fix it."""


# `hf-attn train` / `reproduce` stopped by SIGTERM, SIGINT or SIGUSR1 after saving a checkpoint: "try again later"
# (EX_TEMPFAIL of sysexits.h), so a job script or scheduler can tell a preempted run from a failed one (exit 2).
PREEMPTED_EXIT = 75
PREEMPTION_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1")  # how schedulers (SLURM, Kubernetes, spot) end a job


class HfAttnPreempted(Exception):
    """Training stopped on a signal, with a complete checkpoint of its last step; the message says how to resume."""

    exit_code = PREEMPTED_EXIT


class HfAttnBusy(HfAttnInputError):
    """The output directory is locked by a live run (`training.checkpoints.RunLock`)."""
