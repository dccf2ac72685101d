"""Tenant code that would run in the host process when a kernel is loaded (issue 15,
class 3). ``compile()`` loads every host kernel it builds, so a constructor ran there
and wrote outside the roots. One test per mechanism: a real source whose payload
(writing a file outside every root) does run when the shared object that the system
compiler makes of it, as the host backend links, is ``dlopen``'ed in another process;
and that safejit refuses with ``LoadTimeCodeError`` before anything is published or
loaded — the payload's file is never written. Then what changes the whole process
for the object (an executable stack, search paths, a library name), refused alike."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import safejit
from safejit.backends._elf import Elf
from tests.security._support import assert_nothing_published

#: The payload every attack runs: proof of code execution outside the roots.
PAYLOAD = """#include <stdio.h>
__attribute__((used)) void payload(void) {{
  FILE* f = fopen("{marker}", "w");
  if (f) {{ fputs("ran", f); fclose(f); }}
}}
int kernel(int x) {{ return x + 1; }}
"""
#: The same by raw system calls (x86-64): an IFUNC resolver runs while the loader is
#: still relocating the object, before its calls through the PLT (``fopen``) work.
RAW_PAYLOAD = """int kernel(int x) {{ return x + 1; }}
static void payload(void) {{
  long fd = 2, n = 1, c = 3;  /* open(2), write(1), close(3) */
  __asm__ volatile("syscall" : "+a"(fd) : "D"("{marker}"), "S"(0101L), "d"(0644L) : "rcx", "r11", "memory");
  __asm__ volatile("syscall" : "+a"(n) : "D"(fd), "S"("ran"), "d"(3L) : "rcx", "r11", "memory");
  __asm__ volatile("syscall" : "+a"(c) : "D"(fd) : "rcx", "r11", "memory");
}}
"""


@dataclass(frozen=True)
class Attack:
    code: str
    #: What the refusal must say.
    reason: str
    cxx: bool = False
    payload: str = PAYLOAD


ATTACKS = {
    "constructor": Attack(
        "__attribute__((constructor)) static void run(void) { payload(); }\n", "initialisers (DT_INIT_ARRAY)"
    ),
    "constructor_with_a_priority": Attack(
        "__attribute__((constructor(101))) static void run(void) { payload(); }\n", "initialisers (DT_INIT_ARRAY)"
    ),
    "destructor": Attack(
        "__attribute__((destructor)) static void run(void) { payload(); }\n", "finalisers (DT_FINI_ARRAY)"
    ),
    "cxx_static_initialiser": Attack(
        'extern "C" void payload(void);\nstruct Run { Run() { payload(); } };\nstatic Run run;\n',
        "initialisers (DT_INIT_ARRAY)",
        cxx=True,
    ),
    "cxx_static_object_with_a_destructor": Attack(
        'extern "C" void payload(void);\nstruct Run { ~Run() { payload(); } };\nstatic Run run;\n',
        "initialisers (DT_INIT_ARRAY)",  # (registered with __cxa_atexit by a static initialiser)
        cxx=True,
    ),
    "init_array_entry_in_asm": Attack(
        '__asm__(".section .init_array,\\"aw\\"\\n.quad payload\\n.text\\n");\n', "initialisers (DT_INIT_ARRAY)"
    ),
    "ctors_entry_in_asm": Attack(
        '__asm__(".section .ctors,\\"aw\\"\\n.quad payload\\n.text\\n");\n', "initialisers (DT_INIT_ARRAY)"
    ),
    "code_appended_to_init": Attack(
        '__asm__(".section .init,\\"ax\\",@progbits\\ncall payload@PLT\\n.text\\n");\n', "code was added to it"
    ),
    "code_appended_to_fini": Attack(
        '__asm__(".section .fini,\\"ax\\",@progbits\\ncall payload@PLT\\n.text\\n");\n', "code was added to it"
    ),
    "gnu_ifunc": Attack(
        "static int impl(int x) { return x; }\n"
        "static int (*resolve(void))(int) { payload(); return impl; }\n"
        'int chosen(int) __attribute__((ifunc("resolve")));\n'
        "int call_chosen(int x) { return chosen(x); }\n",  # (bound at load: RTLD_NOW)
        "GNU IFUNC",
        payload=RAW_PAYLOAD,
    ),
    "gnu_ifunc_bound_locally_irelative": Attack(
        "static int impl(int x) { return x; }\n"
        "static int (*resolve(void))(int) { payload(); return impl; }\n"
        'static int chosen(int) __attribute__((ifunc("resolve")));\n'
        "int call_chosen(int x) { return chosen(x); }\n",
        "IRELATIVE",
        payload=RAW_PAYLOAD,
    ),
    "gmon_start_defined": Attack("void __gmon_start__(void) { payload(); }\n", "'__gmon_start__'"),
    "gmon_start_defined_hidden": Attack(
        '__attribute__((visibility("hidden"))) void __gmon_start__(void) { payload(); }\n', "'__gmon_start__'"
    ),
    "tm_clone_registration_defined": Attack(
        "void _ITM_registerTMCloneTable(void* t, long n) { payload(); }\n"
        '__asm__(".section .tm_clone_table,\\"aw\\"\\n.quad kernel\\n.quad kernel\\n.text\\n");\n',
        "'_ITM_registerTMCloneTable'",
    ),
    # (hidden: a global one would lose to libc's, which the loader finds first)
    "cxa_finalize_defined_hidden": Attack(
        '__attribute__((visibility("hidden"))) void __cxa_finalize(void* d) { payload(); }\n', "'__cxa_finalize'"
    ),
}


def _source(attack: Attack, marker: Path) -> str:
    payload = attack.payload.format(marker=marker)
    if attack.cxx:
        payload = 'extern "C" {\n' + payload + "}\n"
    return payload + attack.code


def _link(work: Path, code: str, cxx: bool, *flags: str) -> Path:
    """The shared object the system compiler makes, as the host backend links it."""
    src = work / ("attack.cpp" if cxx else "attack.c")
    src.write_text(code)
    out = work / "attack.so"
    argv = ["c++" if cxx else "cc", "-shared", "-fPIC", "-O2", *flags, "-fno-lto", "-o", str(out), str(src)]
    subprocess.run(argv, check=True, capture_output=True)
    return out


def _dlopen_elsewhere(path: Path) -> None:
    code = "import ctypes, os, sys; ctypes.CDLL(sys.argv[1], mode=os.RTLD_NOW)"
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, capture_output=True)


def _mapped(name: str) -> bool:
    """Whether a library loaded for kernel ``name`` (``memfd:safejit-<name>``) is mapped here."""
    return any(line.split("/memfd:")[-1].startswith(f"safejit-{name} ") for line in _maps())


def _maps() -> list[str]:
    return Path("/proc/self/maps").read_text().splitlines()


def _refused(rt: safejit.Runtime, source: safejit.Source, reason: str, **kw: object) -> safejit.LoadTimeCodeError:
    with pytest.raises(safejit.LoadTimeCodeError) as info:
        rt.compile(source, **kw)  # type: ignore[arg-type]
    assert any(reason in r for r in info.value.reasons), info.value.reasons
    assert reason in str(info.value)
    assert not _mapped(source.name)
    assert rt.stats()["memory_entries"] == 0
    return info.value


@pytest.mark.parametrize("attack", ATTACKS)
def test_code_that_runs_at_load_is_refused_before_it_runs(attack, make_runtime, outside, cache_dir, tmp_path):
    if ATTACKS[attack].payload is RAW_PAYLOAD and platform.machine() != "x86_64":
        pytest.skip("the raw payload is x86-64 code")
    marker = outside / "ran"
    code = _source(ATTACKS[attack], marker)
    # The attack is real: the object the system compiler makes runs the payload when loaded.
    _dlopen_elsewhere(_link(tmp_path, code, ATTACKS[attack].cxx))
    assert marker.read_text() == "ran"
    marker.unlink()
    rt = make_runtime()
    name = f"attack_{attack}"
    source = safejit.Source(code, name, filename=f"{name}.cpp" if ATTACKS[attack].cxx else None)
    _refused(rt, source, ATTACKS[attack].reason)
    assert not marker.exists()
    assert_nothing_published(cache_dir)
    with pytest.raises(safejit.LoadTimeCodeError):  # and again: nothing was remembered
        rt.compile(source)
    assert not marker.exists()
    assert_nothing_published(cache_dir)


def test_a_forged_relocation_that_redirects_an_initialiser_is_refused(make_runtime, outside, cache_dir, tmp_path):
    """Top-level asm can add raw entries to the dynamic relocations: a section named
    like the linker's (``.rela.iplt``) lands in ``.rela.plt``, which the loader applies
    last. One that rewrites the start-up code's initialiser slot (``frame_dummy``)
    makes the loader call the payload, with no constructor anywhere. The slot's and
    the payload's addresses come from a first link: the layout is deterministic."""
    marker = outside / "ran"
    forged = '__asm__(".section .rela.iplt,\\"a\\",@progbits\\n.quad {slot}\\n.quad 8\\n.quad {target}\\n.text\\n");\n'
    draft = _link(tmp_path, PAYLOAD.format(marker=marker) + forged.format(slot=0, target=0), False)
    elf = Elf(draft.read_bytes())
    slot, symtab = elf.section(".init_array"), elf.section(".symtab")
    assert slot is not None and symtab is not None
    target = next(s.value for s in elf.symbols(symtab) if s.name == "payload")
    code = PAYLOAD.format(marker=marker) + forged.format(slot=hex(slot.addr), target=hex(target))
    _dlopen_elsewhere(_link(tmp_path, code, False))
    assert marker.read_text() == "ran"
    marker.unlink()
    _refused(make_runtime(), safejit.Source(code, "forged"), "two of its relocations write the same bytes")
    assert not marker.exists()
    assert_nothing_published(cache_dir)


FLAGGED = {
    # (flags, source, reason): refused by what they make. (What flags make the same —
    # -Wl,-z,execstack, -Wl,-rpath, -Wl,-soname — the flag policy refuses before any
    # compile: test_the_flags_that_make_such_objects_never_reach_the_compiler below;
    # tests/unit/backends/test_load_time.py shows the check names what they would make.)
    "executable_stack_by_asm": (
        (),
        '__asm__(".section .note.GNU-stack,\\"x\\",@progbits\\n.text\\n");\n',
        "executable stack",
    ),
    "text_relocations": (
        (),
        '__asm__(".section .rodata.tr,\\"a\\",@progbits\\n.quad kernel\\n.text\\n");\n',
        "TEXTREL",
    ),
    # (bound for the whole process to the first library defining it: a rebuild runs the old one's)
    "gnu_unique_symbol": (
        (),
        '__asm__(".globl once\\n.section .bss.once,\\"aw\\",@nobits\\n.type once, @gnu_unique_object\\n'
        'once: .zero 4\\n.size once, 4\\n.text\\n");\n',
        "STB_GNU_UNIQUE",
    ),
}


@pytest.mark.parametrize("attack", FLAGGED)
def test_an_object_that_changes_the_process_for_itself_is_refused(attack, make_runtime, project, cache_dir):
    flags, code, reason = FLAGGED[attack]
    rt = make_runtime(source_roots=(str(project),))
    source = safejit.Source("int kernel(int x) { return x + 1; }\n" + code, f"attack_{attack}")
    _refused(rt, source, reason, flags=tuple(f.format(root=project) for f in flags))
    assert_nothing_published(cache_dir)


@pytest.mark.parametrize(
    "flags",
    [
        ("-Wl,-z,execstack",),
        ("-Wl,-rpath,{root}",),
        ("-Wl,-rpath,{root}", "-Wl,--disable-new-dtags"),
        ("-Wl,-soname,libm.so.6",),
    ],
    ids=["executable_stack", "runpath", "rpath", "soname_of_a_system_library"],
)
def test_the_flags_that_make_such_objects_never_reach_the_compiler(flags, make_runtime, project, cache_dir):
    rt = make_runtime(source_roots=(str(project),))
    with pytest.raises(safejit.FlagPolicyError):
        rt.compile(
            safejit.Source("int kernel(int x) { return x + 1; }\n", "flagged"),
            flags=[f.format(root=project) for f in flags],
        )
    assert rt.stats()["compiles"] == 0
    assert_nothing_published(cache_dir)


def test_a_refusal_is_counted_as_a_policy_violation(make_runtime, outside, cache_dir, metric_reader):
    tenant = f"t{os.getpid()}load"
    rt = make_runtime(tenant=tenant)
    with pytest.raises(safejit.LoadTimeCodeError):
        rt.compile(safejit.Source(_source(ATTACKS["constructor"], outside / "ran"), "counted"))
    points = [
        (p.attributes["safejit.kind"], p.value)
        for rm in metric_reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "safejit.policy.violations"
        for p in m.data.data_points
        if p.attributes.get("safejit.tenant") == tenant
    ]
    assert points == [("LoadTimeCodeError", 1)]
    assert not (outside / "ran").exists()
    assert_nothing_published(cache_dir)
