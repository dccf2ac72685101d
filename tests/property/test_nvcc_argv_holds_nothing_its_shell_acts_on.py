"""Whatever flags and defines a tenant gives, the nvcc argv safejit builds holds no
text nvcc's shell could act on (nvcc_shell.check_argv passes it, with plain roots put
in), and macros it cannot pass plainly are in the header, whose lines are the
macros exactly; or the request is refused with a typed error."""

from __future__ import annotations

from typing import Any

from hypothesis import given

from safejit.backends.cuda.backend import CudaBackend
from safejit.backends.cuda.nvcc_shell import check_argv, defines_header, split_macros
from safejit.errors import ConfigError, FlagPolicyError
from safejit.policy.flags import check_defines, check_flags
from safejit.spec import Toolchain

from .strategies import define_maps, family_flags

_NVCC = CudaBackend(compiler="nvcc")
_TOOLCHAIN = Toolchain(
    compiler="/usr/local/cuda/bin/nvcc", version="nvcc 13.0\nhost: /usr/bin/g++ 12", digest="d", roots=()
)
_SLOTS = {
    "{SRC}": "/w/src/k.cu",
    "{OUT}": "/w/k.cubin",
    "{DEP}": "/w/k.d",
    "{DEPNAME}": "k.d",
    "{DEFINES}": "/w/.defines.h",
}


def _anchor(path: str, what: str) -> str:
    return "\0s0\0/include"


@given(drawn=family_flags(), defines=define_maps)
def test_nvcc_argv_holds_nothing_its_shell_acts_on(drawn: tuple[str, list[Any]], defines: dict[Any, Any]) -> None:
    _, flags = drawn  # (any family's entries: nvcc must refuse what is not its own)
    try:
        checked = check_flags(flags, _anchor, family="nvcc")
        macros = check_defines(defines)
        argv = _NVCC.argv(
            toolchain=_TOOLCHAIN,
            language="cuda",
            flags=checked,
            defines=macros,
            include_dirs=["\0s0\0/inc"],
            quote_dir=None,
            arch="sm_90",
        )
        header = defines_header(checked, macros)
    except (FlagPolicyError, ConfigError):
        return
    check_argv(argv, [_SLOTS.get(a) or a.replace("\0s0\0", "/root") for a in argv])
    _, plain, rest = split_macros(checked, macros)
    assert [a for a in argv if a.startswith(("-D", "-U"))] == plain
    lines = header.decode().split("\n")[:-1] if header is not None else []
    assert len(lines) == len(rest)
    for line, macro in zip(lines, rest, strict=True):
        name, eq, value = macro[2:].partition("=")
        want = f"#undef {name}" if macro.startswith("-U") else f"#define {name} {value if eq else '1'}"
        assert line == want
