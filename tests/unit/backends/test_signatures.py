"""The compiler's version read from its ``--version`` (``_signatures.gcc_major``), which
picks the flags that keep a diagnostic from reopening a file a ``#line`` names."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from safejit.backends._signatures import gcc_major, no_caret_flags


@pytest.mark.parametrize(
    ("first_line", "major"),
    [
        ("gcc (Debian 12.2.0-14) 12.2.0", 12),
        ("gcc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0", 11),
        ("cc (GCC) 13.2.1 20230801", 13),  # (a date after the version is no version)
        ("gcc (GCC) 4.8.5 20150623 (Red Hat 4.8.5-44)", 4),
        ("x86_64-linux-gnu-gcc-10 (Debian 10.2.1-6) 10.2.1 20210110", 10),
        ("gcc version unknown", None),
        ("", None),
    ],
)
def test_the_major_version_is_the_last_dotted_number_of_the_first_line(first_line, major):
    assert gcc_major(first_line + "\nCopyright (C) 2022 Free Software Foundation, Inc. 9.9\n") == major


def test_gcc_from_11_counts_columns_in_bytes_and_clang_drops_carets():
    assert no_caret_flags("gcc (GCC) 11.1.0") == ("-fno-diagnostics-show-caret", "-fdiagnostics-column-unit=byte")
    assert no_caret_flags("gcc (GCC) 10.3.0") == ("-fno-diagnostics-show-caret",)
    assert no_caret_flags("Debian clang version 14.0.6") == ("-fno-caret-diagnostics",)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc")
def test_this_machines_gcc_is_read_as_its_own_dumpversion():
    said = subprocess.run(["gcc", "--version"], capture_output=True, text=True, check=True).stdout
    dumped = subprocess.run(["gcc", "-dumpversion"], capture_output=True, text=True, check=True).stdout
    assert gcc_major(said) == int(dumped.split(".")[0])
