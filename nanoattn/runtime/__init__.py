"""Runtime policy every entry point shares, one module a topic:

- ``device``: the device and dtype vocabularies, autocast, and the memory check before allocation;
- ``compilation``: whether ``torch.compile`` can run here, and where its kernels are cached;
- ``process``: console lines, the user's cache folder, the malloc policy;
- ``files``: atomic writes and the locks processes side by side take;
- ``outputs``: the one rule for every path a command writes.

Everything is importable from ``nanoattn.runtime`` itself.
"""

from nanoattn.runtime.compilation import (
    check_compile_choice,
    compile_choice,
    compiler_missing,
    use_compile_cache,
    use_deterministic_compilation,
)
from nanoattn.runtime.device import (
    DEVICES,
    DTYPES,
    affordable,
    autocast,
    autocast_dtype,
    check_device_name,
    check_fits,
    cpu_flags,
    cpu_name,
    fits,
    memory_bytes,
    pick_device,
    synchronize,
)
from nanoattn.runtime.files import (
    HOLDER_FILE,
    LockedError,
    exclusive_lock,
    fsync_dir,
    temporary_sibling,
    write_atomic,
)
from nanoattn.runtime.outputs import (
    CHECKOUT,
    CHECKPOINTS,
    MODEL_WEIGHTS,
    RUN_CONFIG,
    check_output,
    checkpoint_holding,
    is_repository_root,
    json_object_with,
)
from nanoattn.runtime.process import cache_dir, keep_freed_memory, note

__all__ = ["CHECKOUT", "CHECKPOINTS", "DEVICES", "DTYPES", "HOLDER_FILE", "LockedError", "MODEL_WEIGHTS",
           "RUN_CONFIG", "affordable", "autocast", "autocast_dtype", "cache_dir", "check_compile_choice",
           "check_device_name", "check_fits", "check_output", "checkpoint_holding", "compile_choice",
           "compiler_missing", "cpu_flags", "cpu_name", "exclusive_lock", "fits", "fsync_dir",
           "is_repository_root", "json_object_with", "keep_freed_memory", "memory_bytes", "note",
           "pick_device", "synchronize", "temporary_sibling", "use_compile_cache",
           "use_deterministic_compilation", "write_atomic"]
