"""Coverage-guided fuzzing of safejit's parsers of untrusted bytes (run by hand).

    pip install atheris
    python fuzz/fuzz_parsers.py -atheris_runs=200000            # all parsers
    python fuzz/fuzz_parsers.py corpus_dir/ -max_total_time=600

A crash is any exception other than the parser's typed error.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from safejit.backends.ascend.backend import ascend_kernel_names
    from safejit.backends.cuda.cubin import cubin_frame_sizes, cubin_kernels
    from safejit.backends.host import elf_exported_functions
    from safejit.cache.leaf import ManifestError, decode_manifest
    from safejit.closure.depfiles import parse_depfile, parse_single_rule
    from safejit.errors import LoadError


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    which = fdp.ConsumeIntInRange(0, 5)
    rest = fdp.ConsumeBytes(fdp.remaining_bytes())
    if which == 0:
        try:
            decode_manifest(rest)
        except ManifestError:
            pass
    elif which == 1:
        parse_depfile(rest.decode("utf-8", "replace"))
    elif which == 2:
        try:
            parse_single_rule(rest.decode("utf-8", "replace"))
        except ValueError:
            pass
    else:
        fn = (elf_exported_functions, cubin_kernels, ascend_kernel_names)[which - 3]
        try:
            fn(b"\x7fELF\x02\x01\x01" + rest if rest[:1] != b"\x7f" else rest)
        except LoadError:
            pass
        cubin_frame_sizes(rest)


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
