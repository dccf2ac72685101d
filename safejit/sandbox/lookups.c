/* safejit lookup recorder: every path the process looks up, complete by construction.
 *
 * Loaded (dlopen) into the NVRTC worker, which calls lookups_install() once it has
 * loaded NVRTC and restricted itself with Landlock. From then on a seccomp filter
 * traps (SIGSYS) every syscall that looks a path up, unless it is made by one
 * instruction: the syscall in lookup_syscall() below. The SIGSYS handler makes the
 * call from there, on the caller's behalf, and records it. So libc's entry points,
 * libc's internal calls (fopen's own open), syscall(2) and inline syscalls all pass
 * through the handler: nothing to interpose, no list of libc functions to keep up
 * to date. Failed lookups are recorded too: they are the negative dependencies.
 *
 * Path syscalls that only write, execute or mount, and fork (a child's lookups would
 * be recorded in its own memory), are refused with EPERM; clone3 with ENOSYS (its
 * flags are out of a filter's reach; libc then uses clone, allowed for threads only);
 * io_uring (its operations bypass seccomp) with EPERM; syscalls newer than this list
 * with ENOSYS. A syscall of another architecture kills the process.
 *
 * Records, between lookups_begin() and lookups_end(), in a buffer of up to 64 MiB:
 *   u32 size of the record, i32 kind, i64 result (-errno on failure), i32 flags,
 *   the path (absolute when it was relative to a directory fd; not NUL-terminated).
 * A full buffer makes lookups_end() return -1.
 *
 * Preloaded, an open for reading that the sandbox refused (EACCES: Landlock, a file there
 * outside every root), or that failed another way that says something of the path (a
 * name too long in a dir that is there), is handed to the program as ENOENT, and
 * recorded as it was: the compile goes on as it would had nothing been there (gcc
 * stopped at such a failure: how long a compile took said whether the file was there).
 * The records file itself is never the program's to open.
 *
 * Preloaded (LD_PRELOAD) into a compiler driver's whole process tree, with
 * SAFEJIT_LOOKUPS naming a file, it records in the preprocessing programs only (GCC's
 * cc1 and cc1plus; clang's `clang -cc1`, a program of its own when the driver is given
 * -fno-integrated-cc1, known by its arguments: what looks headers up, and runs
 * nothing; and GNU as): installed as the program starts, each record appended to that
 * file as it is made, before the lookup's result reaches the program (a process killed
 * at a time limit has all it acted on written down), between a begin record (kind 0,
 * result 1) and an end record (kind 0, result 0) written as it exits.
 * Every other program it is loaded into (the driver, the linker, nvcc's) it leaves
 * alone. No file at all: nothing vouches for the compile. In a preprocessor, renames
 * are let through (clang -cc1 renames its object into place).
 *
 * A program that sets its own SIGSYS handler (LLVM's crash handlers do) would take the
 * trapped calls for a crash: setting one is refused with EPERM once the filter is in.
 *
 * Built once per user by safejit.sandbox._shim_build with the system C compiler.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <ucontext.h>
#include <unistd.h>

#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#define REG_RESULT(uc) ((uc)->uc_mcontext.gregs[REG_RAX])
static long arg(const ucontext_t *uc, int i) {
    static const int regs[6] = { REG_RDI, REG_RSI, REG_RDX, REG_R10, REG_R8, REG_R9 };
    return (long)uc->uc_mcontext.gregs[regs[i]];
}
__asm__(
    ".text\n"
    ".globl lookup_syscall\n.hidden lookup_syscall\n.type lookup_syscall,@function\n"
    "lookup_syscall:\n"
    "  mov %rdi, %rax\n  mov %rsi, %rdi\n  mov %rdx, %rsi\n  mov %rcx, %rdx\n"
    "  mov %r8, %r10\n  mov %r9, %r8\n  mov 8(%rsp), %r9\n"
    "  syscall\n"
    ".globl lookup_syscall_ip\n.hidden lookup_syscall_ip\n"
    "lookup_syscall_ip:\n"
    "  ret\n");
#elif defined(__aarch64__)
#define ARCH AUDIT_ARCH_AARCH64
#define REG_RESULT(uc) ((uc)->uc_mcontext.regs[0])
static long arg(const ucontext_t *uc, int i) { return (long)uc->uc_mcontext.regs[i]; }
__asm__(
    ".text\n"
    ".globl lookup_syscall\n.hidden lookup_syscall\n.type lookup_syscall,%function\n"
    "lookup_syscall:\n"
    "  mov x8, x0\n  mov x0, x1\n  mov x1, x2\n  mov x2, x3\n  mov x3, x4\n  mov x4, x5\n  mov x5, x6\n"
    "  svc #0\n"
    ".globl lookup_syscall_ip\n.hidden lookup_syscall_ip\n"
    "lookup_syscall_ip:\n"
    "  ret\n");
#else
#error "the lookup recorder supports x86_64 and aarch64"
#endif

/* The one place path syscalls may come from; the filter knows it by the address of
 * the instruction after the syscall (what seccomp reports as instruction_pointer). */
long lookup_syscall(long nr, long a, long b, long c, long d, long e, long f);
extern char lookup_syscall_ip[];

enum { K_OPEN = 1, K_STAT = 2, K_LSTAT = 3, K_ACCESS = 4, K_READLINK = 5, K_STATFS = 6, K_CHDIR = 7 };
#define BUFFER_BYTES (64UL << 20)
#define HEAD 20
/* Syscall numbers from here on are the same on every architecture (since Linux 5.1);
 * from fchmodat2 (452) on, this list knows none: refused with ENOSYS. */
#define FIRST_UNKNOWN 452

static char *buffer;
static size_t used;
static int recording, overflow;
/* Preloaded: the file each record is appended to as it is made (no buffer). */
static int preload_out = -1;
/* Preloaded (below): what adds nothing to the lookups a preprocessor makes, and costs a
 * trap each, is not trapped — an fstat of a descriptor (AT_EMPTY_PATH), and readlink,
 * realpath's walk over paths that are opened or stat'ed as well. */
static int light;

static size_t fd_path(long fd, char *out, size_t cap) {
    /* (the kernel reads a descriptor as an int: one that is negative names no directory) */
    if ((int)fd < 0) return 0;
    char link[40] = "/proc/self/fd/";
    char digits[24];
    int n = 0;
    unsigned long v = (unsigned long)(unsigned int)(int)fd;
    do { digits[n++] = (char)('0' + v % 10); v /= 10; } while (v && n < 20);
    for (int k = 0; k < n; k++) link[14 + k] = digits[n - 1 - k];
    link[14 + n] = 0;
    long got = lookup_syscall(SYS_readlinkat, AT_FDCWD, (long)link, (long)out, (long)cap - 1, 0, 0);
    if (got <= 0) return 0;
    out[got] = '/';
    return (size_t)got + 1;
}

/* One record, in one append: records of processes writing side by side never
 * interleave. (A write cut short by a kill leaves a torn last record: a lookup whose
 * result the program never saw.) One that cannot be written (a full disk, the file
 * size limit) ends the process before the program sees the result: whatever it did
 * rests on lookups written down. */
static void append(int kind, long result, long flags, const char *dir, size_t dlen, const char *path, size_t plen) {
    char head[HEAD];
    uint32_t head_size = (uint32_t)(HEAD + dlen + plen);
    int32_t head_kind = kind, head_flags = (int32_t)flags;
    int64_t head_result = result;
    memcpy(head, &head_size, 4);
    memcpy(head + 4, &head_kind, 4);
    memcpy(head + 8, &head_result, 8);
    memcpy(head + 16, &head_flags, 4);
    struct iovec parts[3] = { { head, HEAD }, { (void *)dir, dlen }, { (void *)path, plen } };
    ssize_t w;
    do w = writev(preload_out, parts, 3); while (w < 0 && errno == EINTR);
    if (w != (ssize_t)head_size) raise(SIGKILL);
}

static void record(int kind, long dirfd, const char *path, long result, long flags) {
    if (!__atomic_load_n(&recording, __ATOMIC_ACQUIRE) || path == NULL) return;
    char dir[4096];
    size_t dlen = path[0] != '/' && dirfd != AT_FDCWD ? fd_path(dirfd, dir, sizeof dir) : 0;
    size_t plen = strnlen(path, 4096);
    size_t size = HEAD + dlen + plen;
    if (preload_out >= 0) {
        append(kind, result, flags, dir, dlen, path, plen);
        return;
    }
    size_t at = __atomic_fetch_add(&used, size, __ATOMIC_RELAXED);
    if (at + size > BUFFER_BYTES) {
        __atomic_store_n(&overflow, 1, __ATOMIC_RELAXED);
        return;
    }
    uint32_t head_size = (uint32_t)size;
    int32_t head_kind = kind, head_flags = (int32_t)flags;
    int64_t head_result = result;
    char *p = buffer + at;
    memcpy(p, &head_size, 4);
    memcpy(p + 4, &head_kind, 4);
    memcpy(p + 8, &head_result, 8);
    memcpy(p + 16, &head_flags, 4);
    memcpy(p + HEAD, dir, dlen);
    memcpy(p + HEAD + dlen, path, plen);
}

static int empty(long path) { return path != 0 && *(const char *)path == 0; }

/* An open for reading, made so that it cannot block: a FIFO (or a device) where a
 * header was would hang the compile for good. Anything but a regular file or a
 * directory is refused (EINVAL) once opened without blocking. */
static long open_for_reading(long nr, long *a, int flag_arg) {
    long flags = a[flag_arg];
    if ((flags & O_ACCMODE) != O_RDONLY || (flags & O_PATH))
        return lookup_syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
    long b[6] = { a[0], a[1], a[2], a[3], a[4], a[5] };
    b[flag_arg] |= O_NONBLOCK;
    long fd = lookup_syscall(nr, b[0], b[1], b[2], b[3], b[4], b[5]);
    if (fd < 0) return fd;
    struct stat st;
    /* (libc's fstat would be a path syscall made elsewhere: trapped again, in this handler) */
    if (lookup_syscall(SYS_fstat, fd, (long)&st, 0, 0, 0, 0) != 0 || !(S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))) {
        close((int)fd);
        return -EINVAL;
    }
    if (!(flags & O_NONBLOCK)) fcntl((int)fd, F_SETFL, fcntl((int)fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

/* Whether an open's error errno says something of the path (what is there), rather
 * than of the process (out of descriptors, of memory). */
static int about_the_path(long e) {
    return e == EACCES || e == EPERM || e == ENAMETOOLONG || e == ELOOP || e == ENOTDIR || e == EINVAL ||
           e == ENXIO || e == ENODEV || e == EISDIR || e == EXDEV;
}

/* Whether the syscall nr opens a file (its result a descriptor). */
static int opens(long nr) {
#ifdef SYS_open
    if (nr == SYS_open || nr == SYS_creat) return 1;
#endif
    return nr == SYS_openat || nr == SYS_openat2;
}

/* Preloaded: the records file, by its device and inode. */
static dev_t records_dev;
static ino_t records_ino;

static int is_records(int fd) {
    struct stat st;
    return preload_out >= 0 && lookup_syscall(SYS_fstat, fd, (long)&st, 0, 0, 0, 0) == 0 &&
           st.st_dev == records_dev && st.st_ino == records_ino;
}

/* Whether the syscall nr with arguments a opens a file to read. */
static int reading(long nr, const long *a) {
#ifdef SYS_open
    if (nr == SYS_open) return (a[1] & O_ACCMODE) == O_RDONLY;
#endif
    if (nr == SYS_openat) return (a[2] & O_ACCMODE) == O_RDONLY;
    return 0;
}

static void on_sigsys(int sig, siginfo_t *info, void *context) {
    (void)sig;
    ucontext_t *uc = context;
    int saved = errno;
    long nr = info->si_syscall, a[6];
    for (int i = 0; i < 6; i++) a[i] = arg(uc, i);
    long r;
    switch (nr) {
#ifdef SYS_open
    case SYS_open: r = open_for_reading(nr, a, 1); break;
#endif
    case SYS_openat: r = open_for_reading(nr, a, 2); break;
    default: r = lookup_syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]); break;
    }
    const char *p0 = (const char *)a[0], *p1 = (const char *)a[1];
    switch (nr) {
#ifdef SYS_open
    case SYS_open: record(K_OPEN, AT_FDCWD, p0, r, a[1]); break;
    case SYS_creat: record(K_OPEN, AT_FDCWD, p0, r, O_CREAT | O_WRONLY | O_TRUNC); break;
    case SYS_stat: record(K_STAT, AT_FDCWD, p0, r, 0); break;
    case SYS_lstat: record(K_LSTAT, AT_FDCWD, p0, r, 0); break;
    case SYS_access: record(K_ACCESS, AT_FDCWD, p0, r, a[1]); break;
    case SYS_readlink: record(K_READLINK, AT_FDCWD, p0, r, 0); break;
#endif
    case SYS_openat: record(K_OPEN, a[0], p1, r, a[2]); break;
    case SYS_openat2: record(K_OPEN, a[0], p1, r, a[2] ? (long)*(const uint64_t *)a[2] : 0); break;
    case SYS_newfstatat:
        if (!((a[3] & AT_EMPTY_PATH) && empty(a[1])))  /* (fstat of an fd: no lookup) */
            record(a[3] & AT_SYMLINK_NOFOLLOW ? K_LSTAT : K_STAT, a[0], p1, r, a[3]);
        break;
    case SYS_statx:
        if (!((a[2] & AT_EMPTY_PATH) && empty(a[1])))
            record(a[2] & AT_SYMLINK_NOFOLLOW ? K_LSTAT : K_STAT, a[0], p1, r, a[2]);
        break;
    case SYS_faccessat: record(K_ACCESS, a[0], p1, r, a[2]); break;
    case SYS_faccessat2: record(K_ACCESS, a[0], p1, r, a[2]); break;
    case SYS_readlinkat: record(K_READLINK, a[0], p1, r, 0); break;
    case SYS_statfs: record(K_STATFS, AT_FDCWD, p0, r, 0); break;
    case SYS_chdir: record(K_CHDIR, AT_FDCWD, p0, r, 0); break;
    default: break;
    }
    /* Preloaded: a file the sandbox refused to open for reading (Landlock: there, outside
     * every root) reads to the program as one not there (recorded as refused, which
     * refuses the build); so does any other failure that says something of what is
     * there (a name too long in a dir that is there, a loop of links). gcc stopped at
     * once at such a failure, while a file not there let the compile go on: how long it
     * took said which. */
    if (light && r < 0 && r != -ENOENT && reading(nr, a) && about_the_path(-r)) r = -ENOENT;
    /* Preloaded: the records file itself is never the program's to read (it holds what
     * each lookup truly found: a source that includes it would read past the line above). */
    if (light && r >= 0 && opens(nr) && is_records((int)r)) {
        close((int)r);
        r = -ENOENT;
    }
    REG_RESULT(uc) = r;
    errno = saved;
}

/* Path lookups: trapped, made by the handler, recorded. */
static const long traced[] = {
#ifdef SYS_open
    SYS_open, SYS_creat, SYS_stat, SYS_lstat, SYS_access, SYS_readlink,
#endif
    SYS_openat, SYS_openat2, SYS_newfstatat, SYS_statx, SYS_faccessat, SYS_faccessat2, SYS_readlinkat,
    SYS_statfs, SYS_chdir,
};

/* No compile needs these: refused with EPERM. */
static const long refused[] = {
#ifdef SYS_fork
    SYS_fork, SYS_vfork, SYS_mkdir, SYS_rmdir, SYS_link, SYS_unlink, SYS_symlink, SYS_rename, SYS_chmod,
    SYS_chown, SYS_lchown, SYS_mknod, SYS_utime, SYS_utimes, SYS_futimesat, SYS_uselib,
#endif
    SYS_renameat, SYS_execve, SYS_execveat, SYS_io_uring_setup, SYS_io_uring_enter, SYS_io_uring_register,
    SYS_getxattr, SYS_lgetxattr, SYS_listxattr, SYS_llistxattr, SYS_setxattr, SYS_lsetxattr,
    SYS_removexattr, SYS_lremovexattr, SYS_truncate, SYS_mkdirat, SYS_mknodat, SYS_fchownat, SYS_unlinkat,
    SYS_renameat2, SYS_linkat, SYS_symlinkat, SYS_fchmodat, SYS_utimensat, SYS_inotify_add_watch,
    SYS_fanotify_mark, SYS_name_to_handle_at, SYS_open_by_handle_at, SYS_chroot, SYS_pivot_root, SYS_mount,
    SYS_umount2, SYS_swapon, SYS_swapoff, SYS_acct, SYS_quotactl, SYS_open_tree, SYS_move_mount, SYS_fsopen,
    SYS_fspick, SYS_fsconfig, SYS_mount_setattr,
};

#define N_TRACED (sizeof traced / sizeof traced[0])
#define N_REFUSED (sizeof refused / sizeof refused[0])
#define STMT(code, k) ((struct sock_filter)BPF_STMT(code, k))
#define JUMP(code, k, jt, jf) ((struct sock_filter)BPF_JUMP(code, k, jt, jf))
#define LOAD(field) STMT(BPF_LD | BPF_W | BPF_ABS, (uint32_t)(field))
#define RET(value) STMT(BPF_RET | BPF_K, value)

static int is_rename(long nr) {
#ifdef SYS_rename
    if (nr == SYS_rename) return 1;
#endif
    return nr == SYS_renameat || nr == SYS_renameat2;
}

/* Returns 0, or -errno. Once installed, the filter stays for the life of the process. */
int lookups_install(void) {
    static int installed;
    if (installed) return -EALREADY;
    installed = 1;
    if (!light) {  /* (preloaded, records are written through: no buffer) */
        void *mem = mmap(NULL, BUFFER_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (mem == MAP_FAILED) return -errno;
        buffer = mem;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigsys;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSYS, &sa, NULL) != 0) return -errno;
    sigset_t sys;
    sigemptyset(&sys);
    sigaddset(&sys, SIGSYS);
    if (pthread_sigmask(SIG_UNBLOCK, &sys, NULL) != 0) return -EINVAL;

    struct sock_filter f[48 + N_TRACED + N_REFUSED];
    int n = 0;
    uint64_t ip = (uint64_t)(uintptr_t)lookup_syscall_ip;
    f[n++] = LOAD(offsetof(struct seccomp_data, arch));
    f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0);
    f[n++] = RET(SECCOMP_RET_KILL_PROCESS);
    f[n++] = LOAD(offsetof(struct seccomp_data, instruction_pointer));
    f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)ip, 0, 3);
    f[n++] = LOAD(offsetof(struct seccomp_data, instruction_pointer) + 4);
    f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)(ip >> 32), 0, 1);
    f[n++] = RET(SECCOMP_RET_ALLOW);
    f[n++] = LOAD(offsetof(struct seccomp_data, nr));
    f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone3, 0, 1);
    f[n++] = RET(SECCOMP_RET_ERRNO | ENOSYS);
    f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone, 0, 4);
    f[n++] = LOAD(offsetof(struct seccomp_data, args[0]));
    f[n++] = JUMP(BPF_JMP | BPF_JSET | BPF_K, CLONE_THREAD, 0, 1);
    f[n++] = RET(SECCOMP_RET_ALLOW);
    f[n++] = RET(SECCOMP_RET_ERRNO | EPERM);
    /* rt_sigaction(SIGSYS, act != NULL, ...): EPERM (a query, act NULL, goes through) */
    f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_rt_sigaction, 0, 7);
    f[n++] = LOAD(offsetof(struct seccomp_data, args[0]));
    f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SIGSYS, 0, 5);
    f[n++] = LOAD(offsetof(struct seccomp_data, args[1]));
    f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 2);
    f[n++] = LOAD(offsetof(struct seccomp_data, args[1]) + 4);
    f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, 0);
    f[n++] = RET(SECCOMP_RET_ERRNO | EPERM);
    f[n++] = LOAD(offsetof(struct seccomp_data, nr));
    if (light) {
        f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_newfstatat, 0, 4);
        f[n++] = LOAD(offsetof(struct seccomp_data, args[3]));
        f[n++] = JUMP(BPF_JMP | BPF_JSET | BPF_K, AT_EMPTY_PATH, 0, 1);
        f[n++] = RET(SECCOMP_RET_ALLOW);
        f[n++] = LOAD(offsetof(struct seccomp_data, nr));
    }
    int first = n;
    long listed[N_TRACED + N_REFUSED];
    size_t count = 0, n_traced = 0;
    for (size_t i = 0; i < N_TRACED; i++) {
#ifdef SYS_readlink
        if (light && traced[i] == SYS_readlink) continue;
#endif
        if (light && traced[i] == SYS_readlinkat) continue;
        listed[count++] = traced[i];
    }
    n_traced = count;
    for (size_t i = 0; i < N_REFUSED; i++) {
        if (light && is_rename(refused[i])) continue;
        listed[count++] = refused[i];
    }
    for (size_t i = 0; i < count; i++) f[n++] = JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)listed[i], 0, 0);
    int newer = n;
    f[n++] = JUMP(BPF_JMP | BPF_JGE | BPF_K, FIRST_UNKNOWN, 0, 0);
    f[n++] = RET(SECCOMP_RET_ALLOW);
    int trap = n;
    f[n++] = RET(SECCOMP_RET_TRAP);
    int eperm = n;
    f[n++] = RET(SECCOMP_RET_ERRNO | EPERM);
    int enosys = n;
    f[n++] = RET(SECCOMP_RET_ERRNO | ENOSYS);
    for (size_t i = 0; i < count; i++) {
        int at = first + (int)i;
        f[at].jt = (uint8_t)((i < n_traced ? trap : eperm) - at - 1);
    }
    f[newer].jt = (uint8_t)(enosys - newer - 1);
    struct sock_fprog prog = { (unsigned short)n, f };
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -errno;
    /* TSYNC: every thread of the process, not only this one. */
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog) != 0) return -errno;
    return 0;
}

void lookups_begin(void) {
    __atomic_store_n(&used, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&overflow, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&recording, 1, __ATOMIC_RELEASE);
}

/* Stop recording. *out: the records; returns their size, -1 when the buffer overflowed. */
long lookups_end(const char **out) {
    __atomic_store_n(&recording, 0, __ATOMIC_SEQ_CST);
    *out = buffer;
    if (__atomic_load_n(&overflow, __ATOMIC_ACQUIRE)) return -1;
    return (long)__atomic_load_n(&used, __ATOMIC_ACQUIRE);
}

/* -- preloaded: GCC's cc1 and cc1plus ----------------------------------------------- */

/* Whether the program was started as clang's preprocessor: `... -cc1 ...`, or, when the
 * command line was too long for one, `... @FILE` with FILE starting `"-cc1" ` (a response
 * file, as clang writes them). (Not -cc1as: the assembler.) By its arguments, not its
 * name: a clang installed as `cc` is one too. */
static int is_clang_cc1(int argc, char **argv) {
    char buf[8192];
    const char *first = "";
#ifdef __GLIBC__
    (void)buf; /* (glibc hands a constructor main's arguments) */
    if (argc > 1 && argv != NULL && argv[1] != NULL) first = argv[1];
#else
    (void)argc, (void)argv;
    int fd = (int)syscall(SYS_openat, AT_FDCWD, "/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    long got = syscall(SYS_read, fd, buf, sizeof buf - 1);
    syscall(SYS_close, fd);
    if (got <= 0) return 0;
    buf[got] = 0;
    size_t skip = strlen(buf) + 1; /* (argv[0], then argv[1]) */
    if (skip < (size_t)got) first = buf + skip;
#endif
    if (strcmp(first, "-cc1") == 0) return 1;
    if (first[0] != '@') return 0;
    char head[8];
    int rf = (int)syscall(SYS_openat, AT_FDCWD, first + 1, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (rf < 0) return 0;
    long n = syscall(SYS_read, rf, head, sizeof head);
    syscall(SYS_close, rf);
    if (n >= 7 && memcmp(head, "\"-cc1\"", 6) == 0 && (head[6] == ' ' || head[6] == '\n')) return 1;
    return n >= 5 && memcmp(head, "-cc1", 4) == 0 && (head[4] == ' ' || head[4] == '\n');
}

static int is_preprocessor(int argc, char **argv) {
    char exe[4096];
    long n = syscall(SYS_readlinkat, AT_FDCWD, "/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return 0;
    exe[n] = 0;
    const char *base = strrchr(exe, '/');
    base = base ? base + 1 : exe;
    size_t len = strlen(base);
    /* GNU as too (as, x86_64-linux-gnu-as): what inline asm's .incbin and .include name;
     * and nvcc's cicc, which takes a line of the host preprocessor's output that a macro
     * made (# include "/x", no directive to cc1plus) for a directive, and opens its file */
    int gas = strcmp(base, "as") == 0 || (len > 3 && strcmp(base + len - 3, "-as") == 0);
    return gas || strcmp(base, "cc1") == 0 || strcmp(base, "cc1plus") == 0 || strcmp(base, "cicc") == 0 ||
           is_clang_cc1(argc, argv);
}

__attribute__((constructor)) static void preload_begin(int argc, char **argv) {
    const char *out = getenv("SAFEJIT_LOOKUPS");
    if (out == NULL || *out == 0 || !is_preprocessor(argc, argv)) return;
    light = 1;
    if (lookups_install() != 0) return;  /* (then no file: the build is not vouched for) */
    /* (made by the handler, before recording begins) */
    int fd = (int)lookup_syscall(SYS_openat, AT_FDCWD, (long)out, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600, 0, 0);
    if (fd < 0) return;
    struct stat st;
    if (lookup_syscall(SYS_fstat, fd, (long)&st, 0, 0, 0, 0) != 0) return;  /* (no file: unvouched) */
    records_dev = st.st_dev;
    records_ino = st.st_ino;
    preload_out = fd;
    append(0, 1, 0, "", 0, "", 0);  /* (begun: a process with no end record did not finish) */
    lookups_begin();
}

__attribute__((destructor)) static void preload_end(void) {
    if (preload_out < 0) return;
    __atomic_store_n(&recording, 0, __ATOMIC_SEQ_CST);
    append(0, 0, 0, "", 0, "", 0);  /* (the descriptor stays: a thread still recording writes to it) */
}
