/* safejit exec shim: puts the walls around a compiler, runs it, and reaps all it started.
 *
 *   shim -R [-U] [-T BYTES -i INODES] [-u UID -g GID] [-S FILTER_HEX] [-L FILE]
 *
 * Started ahead of need, with stdin a socket to the runner. What it can do before a
 * run is known it does at once (the options above, the same for every run of one
 * sandbox), then reports on that socket:
 *
 *   "safejit-shim 2 userns=U mntns=M scratch=S seccomp=C landlock=L uid=I nproc=P\n"
 *
 * with the scratch tmpfs's mount descriptor attached (SCM_RIGHTS) when S is 1.
 *   -U   a new user and mount namespace: this uid mapped to itself; as root, uid/gid 0
 *        and the ids of -u/-g (root without a user namespace: a mount namespace only).
 *   -T   a tmpfs of BYTES and INODES at most (noexec, nosuid, nodev, mode 0700, owned
 *        by the user the program runs as), not yet mounted anywhere.
 *   -u/-g  the caller is root: the program runs as UID:GID, no supplementary groups.
 *   -S   the seccomp filter (struct sock_filter records, hex) installed before exec.
 *   -L   a file opened now, as the shim's user, and left open on descriptor 200 for
 *        the program and all it starts (the lookup recorder, preloaded as
 *        /proc/self/fd/200: a path in a private dir that the program's uid could not
 *        walk to). Not there: nothing is left open.
 *
 * Then it reads the run's command (see read_request): 4 bytes of length, then
 * NUL-terminated arguments:
 *
 *   [-a AS] [-c CPU_S] [-f FSIZE] [-n NOFILE] [-p NPROC] [-r RO_PATH]... [-w RW_PATH]...
 *   [-N] [-M DIR] [-H DIR] [-C DIR] [-E NAME=VALUE]... -- PROGRAM ARGS...
 *
 * -M mounts the scratch tmpfs on DIR (in this mount namespace only), with copies of
 * the directories and regular files DIR holds; after the run, the regular files at
 * the top of the scratch are copied back into DIR. -H (root, without the scratch
 * tmpfs) hands DIR over to the program's uid (see hand_over). -C changes to
 * DIR after that; -E, given at all, replaces the environment; -N denies TCP
 * bind/connect where the Landlock ABI allows it (>= 4). Without -r/-w no Landlock
 * ruleset is applied. EOF before a command: exit 0 quietly.
 *
 * Once the program and everything it started are dead and reaped, "exit CODE\n"
 * goes to the socket, then the shim exits with CODE.
 *
 * Exit codes 123-127 are the shim's own (123 out of processes, memory or descriptors
 * for a moment, 124 bad usage, 125 a wall unavailable, 126 setup failed, 127 exec
 * failed); the message goes to stderr. Any wall it was asked for that fails in the
 * program's process is fatal (126, or 123 for want of a resource): a run never goes
 * ahead with less than the report said. A shortage says nothing of the walls (123 is
 * never read as a wall that cannot be put up).
 *
 * The program runs as the shim's child, started ahead too: it takes its ids, no new
 * privileges and the seccomp filter before the run is known, then waits for the
 * command (see start_program). The shim is a child subreaper, so nothing the
 * compiler starts can outlive it (see supervise()). SIGTERM makes it kill
 * everything and exit 137.
 *
 * Built once per user by safejit.sandbox._shim_build with the system C compiler,
 * into the private state dir, and executed through the descriptor it was opened
 * with. It runs between fork and the compiler, so there is no preexec_fn.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#define SYS_ll_create 444
#define SYS_ll_add 445
#define SYS_ll_restrict 446
#define LL_VERSION (1U << 0)
#define LL_RULE_PATH_BENEATH 1
#define LL_RULE_NET_PORT 2

#define FS_EXECUTE (1ULL << 0)
#define FS_WRITE_FILE (1ULL << 1)
#define FS_READ_FILE (1ULL << 2)
#define FS_READ_DIR (1ULL << 3)
#define FS_ALL_V1 ((1ULL << 13) - 1)
#define FS_REFER (1ULL << 13)
#define FS_TRUNCATE (1ULL << 14)
#define FS_IOCTL_DEV (1ULL << 15)
#define NET_BIND_TCP (1ULL << 0)
#define NET_CONNECT_TCP (1ULL << 1)
#define SCOPE_ABSTRACT_UNIX_SOCKET (1ULL << 0)
#define SCOPE_SIGNAL (1ULL << 1)

/* The new mount API (one numbering on every architecture but alpha). */
#define SYS_open_tree_ 428
#define SYS_move_mount_ 429
#define SYS_fsopen_ 430
#define SYS_fsconfig_ 431
#define SYS_fsmount_ 432
#define FSOPEN_CLOEXEC_ 0x1
#define FSCONFIG_SET_STRING_ 1
#define FSCONFIG_CMD_CREATE_ 6
#define FSMOUNT_CLOEXEC_ 0x1
#define MOUNT_ATTR_NOSUID_ 0x2
#define MOUNT_ATTR_NODEV_ 0x4
#define MOUNT_ATTR_NOEXEC_ 0x8
#define MOVE_MOUNT_F_EMPTY_PATH_ 0x4

#define SECCOMP_SET_MODE_FILTER_ 1
#define SECCOMP_GET_ACTION_AVAIL_ 2
#define SECCOMP_RET_KILL_PROCESS_ 0x80000000U
#define CAP_DAC_READ_SEARCH_ 2
#define CAP_VERSION_3 0x20080522
#define SECBIT_NOROOT (1 << 0)
#define SECBIT_NOROOT_LOCKED (1 << 1)
#define SECBIT_KEEP_CAPS_LOCKED (1 << 5)

struct ll_ruleset_attr { uint64_t fs; uint64_t net; uint64_t scoped; };
struct ll_path_beneath { uint64_t allowed; int32_t parent_fd; } __attribute__((packed));
struct bpf_insn { uint16_t code; uint8_t jt, jf; uint32_t k; };
struct bpf_prog { unsigned short len; struct bpf_insn *filter; };
struct cap_header { uint32_t version; int pid; };
struct cap_data { uint32_t effective, permitted, inheritable; };

#define MAX_PATHS 256

/* Out of processes, memory or descriptors: for a moment, not for want of a wall. */
static int shortage(int e) { return e == EAGAIN || e == ENOMEM || e == ENFILE || e == EMFILE; }

static void die(int code, const char *what) {
    int e = errno;
    fprintf(stderr, "safejit-shim: %s: %s\n", what, strerror(e));
    _exit((code == 126 || code == 127) && shortage(e) ? 123 : code);  /* (127: an exec refused for want of one) */
}

static unsigned long long number(const char *val) {
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(val, &end, 10);
    if (errno || !end || end == val || *end) { errno = EINVAL; die(124, val); }
    return v;
}

/* ---- what is prepared before the run is known ------------------------------------ */

struct ahead {
    int userns, mntns, scratch, seccomp, nproc;
    long landlock;
    long long uid, gid;                 /* the program's ids (-u/-g), -1: the caller's own */
    const char *scratch_bytes, *scratch_inodes;
    struct bpf_prog filter;
    int mount_fd;
    const char *preload;
};

/* Where -L leaves its file open (lookups.py's PRELOAD_FD). */
#define PRELOAD_FD 200

static int write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = write(fd, text, strlen(text));
    int saved = errno;
    close(fd);
    errno = saved;
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

/* As root, the maps name two ids each: the namespace's root is the program's
 * unprivileged uid (and gid), and uid 1 is the real root (the shim itself). Only a
 * process with CAP_SETUID outside the new namespace may write that, so a helper
 * forked before the unshare writes them. */
static int maps_from_outside(pid_t target, const struct ahead *a, int go) {
    pid_t helper = fork();
    if (helper < 0) return -1;
    if (helper == 0) {
        char c, path[64], map[128];
        if (read(go, &c, 1) != 1) _exit(1);  /* (EOF: the unshare failed) */
        snprintf(map, sizeof map, "0 %lld 1\n1 0 1\n", a->uid);
        snprintf(path, sizeof path, "/proc/%ld/uid_map", (long)target);
        if (write_file(path, map) != 0) _exit(shortage(errno) ? 2 : 1);
        snprintf(map, sizeof map, "0 %lld 1\n1 0 1\n", a->gid);
        snprintf(path, sizeof path, "/proc/%ld/gid_map", (long)target);
        _exit(write_file(path, map) == 0 ? 0 : shortage(errno) ? 2 : 1);
    }
    return helper;
}

static int enter_namespaces(const struct ahead *a) {
    uid_t uid = getuid();
    gid_t gid = getgid();
    char map[128];
    if (uid == 0 && a->uid > 0) {
        int go[2];
        if (pipe2(go, O_CLOEXEC) != 0) die(126, "pipe");
        pid_t helper = maps_from_outside(getpid(), a, go[0]);
        close(go[0]);
        if (helper < 0) die(126, "fork");
        int unshared = unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0;
        int saved = errno;
        if (unshared && write(go[1], "x", 1) != 1) die(126, "pipe");
        close(go[1]);
        int st = 0;
        while (waitpid(helper, &st, 0) < 0 && errno == EINTR) {}
        if (!unshared) { errno = saved; if (shortage(saved)) die(126, "unshare"); return -1; }
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            errno = WIFEXITED(st) && WEXITSTATUS(st) == 2 ? EAGAIN : EPERM;  /* (2: the helper's shortage) */
            die(126, "uid_map");
        }
        return 0;
    }
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) {
        if (shortage(errno)) die(126, "unshare");  /* (no namespace for a moment: not none to be had) */
        return -1;
    }
    snprintf(map, sizeof map, "%u %u 1\n", (unsigned)uid, (unsigned)uid);
    if (write_file("/proc/self/uid_map", map) != 0) die(126, "uid_map");
    if (write_file("/proc/self/setgroups", "deny") != 0 && errno != ENOENT) die(126, "setgroups");
    snprintf(map, sizeof map, "%u %u 1\n", (unsigned)gid, (unsigned)gid);
    if (write_file("/proc/self/gid_map", map) != 0) die(126, "gid_map");
    return 0;
}

static int make_tmpfs(const struct ahead *a) {
    int fs = (int)syscall(SYS_fsopen_, "tmpfs", FSOPEN_CLOEXEC_);
    if (fs < 0) return -1;
    char owner[32];
    /* (in the namespace's ids: as root, the unprivileged ids are its uid and gid 0) */
    long long uid = a->uid > 0 ? (a->userns ? 0 : a->uid) : (long long)getuid();
    long long gid = a->gid > 0 ? (a->userns ? 0 : a->gid) : (long long)getgid();
    int ok = syscall(SYS_fsconfig_, fs, FSCONFIG_SET_STRING_, "size", a->scratch_bytes, 0) == 0
        && syscall(SYS_fsconfig_, fs, FSCONFIG_SET_STRING_, "nr_inodes", a->scratch_inodes, 0) == 0
        && syscall(SYS_fsconfig_, fs, FSCONFIG_SET_STRING_, "mode", "0700", 0) == 0;
    snprintf(owner, sizeof owner, "%lld", uid);
    ok = ok && syscall(SYS_fsconfig_, fs, FSCONFIG_SET_STRING_, "uid", owner, 0) == 0;
    snprintf(owner, sizeof owner, "%lld", gid);
    ok = ok && syscall(SYS_fsconfig_, fs, FSCONFIG_SET_STRING_, "gid", owner, 0) == 0;
    ok = ok && syscall(SYS_fsconfig_, fs, FSCONFIG_CMD_CREATE_, NULL, NULL, 0) == 0;
    int mnt = ok ? (int)syscall(SYS_fsmount_, fs, FSMOUNT_CLOEXEC_,
                                MOUNT_ATTR_NOSUID_ | MOUNT_ATTR_NODEV_ | MOUNT_ATTR_NOEXEC_) : -1;
    int saved = errno;
    close(fs);
    errno = saved;
    return mnt;
}

static void parse_filter(struct ahead *a, const char *hex) {
    size_t n = strlen(hex);
    if (n == 0 || n % 16 || n / 16 > 4096) { errno = EINVAL; die(124, "-S"); }
    unsigned char *buf = malloc(n / 2);
    if (!buf) die(126, "malloc");
    for (size_t k = 0; k < n / 2; k++) {
        unsigned v;
        if (sscanf(hex + 2 * k, "%2x", &v) != 1) { errno = EINVAL; die(124, "-S"); }
        buf[k] = (unsigned char)v;
    }
    a->filter.len = (unsigned short)(n / 16);
    a->filter.filter = (struct bpf_insn *)buf;
}

/* Linux 5.14 counts processes per user namespace (ucounts); before, per user. */
static int per_namespace_nproc(void) {
    struct utsname u;
    int major = 0, minor = 0;
    if (uname(&u) != 0 || sscanf(u.release, "%d.%d", &major, &minor) != 2) return 0;
    return major > 5 || (major == 5 && minor >= 14);
}

/* In a user namespace of its own the shim holds every capability there (it needs
 * CAP_SYS_ADMIN to mount, CAP_CHOWN, CAP_SETUID ...), but the program may never
 * regain any but CAP_DAC_READ_SEARCH: the bounding set, which the program inherits,
 * is emptied of the rest now, ahead of the run (one prctl per capability). */
static void drop_bounding_set(void) {
    int last = 40;
    FILE *f = fopen("/proc/sys/kernel/cap_last_cap", "re");
    if (f) { if (fscanf(f, "%d", &last) != 1) last = 40; fclose(f); }
    for (int c = 0; c <= last; c++)
        if (c != CAP_DAC_READ_SEARCH_ && prctl(PR_CAPBSET_DROP, c, 0, 0, 0) != 0 && errno != EINVAL)
            die(126, "capbset");
}

/* What the run touches first, touched now: a fresh process's first use of a page
 * (its heap, a buffer) is a page fault, ~1-2 us each in a VM. */
static char copy_buf[1 << 16];
static void warm(void) {
    memset(copy_buf, 0, sizeof copy_buf);
    void *heap[4];
    for (int k = 0; k < 4; k++) { heap[k] = malloc(40 << 10); if (heap[k]) memset(heap[k], 0, 40 << 10); }
    for (int k = 0; k < 4; k++) free(heap[k]);
}

static void prepare(struct ahead *a) {
    if (a->userns) {
        a->userns = enter_namespaces(a) == 0;
        a->mntns = a->userns;
        if (!a->userns && getuid() == 0 && unshare(CLONE_NEWNS) == 0) {
            /* Root with no user namespace: its mounts must not propagate back out. */
            if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) != 0) die(126, "mount --make-rslave /");
            a->mntns = 1;
        }
    }
    if (a->userns) drop_bounding_set();
    warm();
    a->mount_fd = -1;
    if (a->scratch && a->mntns) a->mount_fd = make_tmpfs(a);
    if (a->scratch && a->mntns && a->mount_fd < 0 && shortage(errno)) die(126, "scratch tmpfs");
    a->scratch = a->mount_fd >= 0;
    uint32_t action = SECCOMP_RET_KILL_PROCESS_;
    a->seccomp = a->filter.len && syscall(SYS_seccomp, SECCOMP_GET_ACTION_AVAIL_, 0, &action) == 0;
    a->landlock = syscall(SYS_ll_create, NULL, 0, LL_VERSION);
    if (a->landlock < 0) a->landlock = 0;
    /* A process limit counts the user's processes: per run in a user namespace of its
     * own; for another uid (the caller is root) all of that uid's; else none is set. */
    a->nproc = (a->userns && per_namespace_nproc()) || a->uid > 0;
}

static void report(const struct ahead *a) {
    char text[256];
    int n = snprintf(text, sizeof text,
                     "safejit-shim 2 userns=%d mntns=%d scratch=%d seccomp=%d landlock=%ld uid=%lld nproc=%d\n",
                     a->userns, a->mntns, a->scratch, a->seccomp, a->landlock,
                     a->uid >= 0 ? a->uid : (long long)getuid(), a->nproc);
    struct iovec io = { text, (size_t)n };
    union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } control;
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &io;
    msg.msg_iovlen = 1;
    if (a->mount_fd >= 0) {
        memset(&control, 0, sizeof control);
        msg.msg_control = control.buf;
        msg.msg_controllen = sizeof control.buf;
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &a->mount_fd, sizeof(int));
    }
    while (sendmsg(0, &msg, MSG_NOSIGNAL) < 0) {
        if (errno == EINTR) continue;
        if (errno == EPIPE || errno == ECONNRESET) _exit(0); /* the runner is gone */
        die(126, "report");
    }
}

/* ---- the scratch: what the work dir holds is copied in, the outputs copied back out ---- */

#define MAX_ENTRIES 4096
#define MAX_DEPTH 16
#define MAX_OUTPUTS 256

static int copy_fd(int in, int out) {
    char *buf = copy_buf;
    for (;;) {
        ssize_t n = read(in, buf, sizeof copy_buf);
        if (n == 0) return 0;
        if (n < 0) { if (errno == EINTR) continue; return -1; }
        for (ssize_t done = 0; done < n;) {
            ssize_t w = write(out, buf + done, (size_t)(n - done));
            if (w < 0) { if (errno == EINTR) continue; return -1; }
            done += w;
        }
    }
}

/* The regular file `name` of directory `from`, opened without following a link or
 * blocking (-1 for anything else). */
static int open_regular(int from, const char *name, struct stat *st) {
    int fd = openat(from, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return -1;
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) { close(fd); errno = EINVAL; return -1; }
    return fd;
}

/* Copy the directories and regular files under `src` into `dst` (links and anything
 * else are left out), each given to the program's ids when `own`. */
static void copy_in(int src, int dst, int own, uid_t uid, gid_t gid, int depth, int *budget) {
    if (own && fchown(dst, uid, gid) != 0) die(126, "chown scratch");
    int dup_src = dup(src);
    DIR *d = dup_src >= 0 ? fdopendir(dup_src) : NULL;
    if (!d) die(126, "read the work dir");
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (--*budget < 0 || depth > MAX_DEPTH) { errno = E2BIG; die(126, "the work dir holds too much"); }
        struct stat st;
        if (fstatat(src, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        if (S_ISDIR(st.st_mode)) {
            if (mkdirat(dst, e->d_name, st.st_mode & 07777) != 0) die(126, "copy into the scratch");
            int s2 = openat(src, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            int d2 = openat(dst, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (s2 < 0 || d2 < 0) die(126, "copy into the scratch");
            copy_in(s2, d2, own, uid, gid, depth + 1, budget);
            close(s2);
            close(d2);
        } else if (S_ISREG(st.st_mode)) {
            int in = open_regular(src, e->d_name, &st);
            if (in < 0) continue;
            int out = openat(dst, e->d_name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, st.st_mode & 07777);
            if (out < 0 || (own && fchown(out, uid, gid) != 0) || copy_fd(in, out) != 0)
                die(126, "copy into the scratch");
            close(in);
            close(out);
        }
    }
    closedir(d);
}

/* Copy the regular files at the top of the scratch `from` into the work dir `to`: each
 * written under a new name, then renamed over whatever file was there (never over a
 * directory). Errors are the runner's to notice: an output is missing. */
static void copy_back(int from, int to) {
    int dup_from = dup(from);
    DIR *d = dup_from >= 0 ? fdopendir(dup_from) : NULL;
    if (!d) return;
    struct dirent *e;
    int copied = 0;
    while ((e = readdir(d)) != NULL && copied < MAX_OUTPUTS) {
        struct stat st;
        int in = open_regular(from, e->d_name, &st);
        if (in < 0) continue;
        char tmp[64];
        snprintf(tmp, sizeof tmp, ".out-%ld-%d", (long)getpid(), copied++);
        int out = openat(to, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        int ok = out >= 0 && copy_fd(in, out) == 0;
        if (out >= 0) close(out);
        close(in);
        if (!ok || renameat(to, tmp, to, e->d_name) != 0) unlinkat(to, tmp, 0);
    }
    closedir(d);
}

/* No scratch tmpfs, and the program runs as another uid (the caller is root): it
 * works in the work dir itself, so that is handed over: the directory, its private (0700) subdirectories and
 * the single-link files in them. Shared parts (a 0755 stage, a linked lock file) stay. */
static void hand_over(int dir, uid_t uid, gid_t gid, int depth, int *budget) {
    if (fchown(dir, uid, gid) != 0) die(126, "hand the work dir over");
    int dup_dir = dup(dir);
    DIR *d = dup_dir >= 0 ? fdopendir(dup_dir) : NULL;
    if (!d) die(126, "read the work dir");
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (--*budget < 0 || depth > MAX_DEPTH) { errno = E2BIG; die(126, "the work dir holds too much"); }
        struct stat st;
        if (fstatat(dir, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        if (S_ISDIR(st.st_mode) && !(st.st_mode & 077)) {
            int sub = openat(dir, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0) die(126, "hand the work dir over");
            hand_over(sub, uid, gid, depth + 1, budget);
            close(sub);
        } else if (S_ISREG(st.st_mode) && st.st_nlink == 1) {
            if (fchownat(dir, e->d_name, uid, gid, AT_SYMLINK_NOFOLLOW) != 0) die(126, "hand the work dir over");
        }
    }
    closedir(d);
}

/* ---- the run ----------------------------------------------------------------------- */

struct request {
    const char *ro[MAX_PATHS], *rw[MAX_PATHS], *env[MAX_PATHS];
    int nro, nrw, nenv, deny_net;
    const char *cwd, *mount_dir, *hand_dir;
    const char *as, *cpu, *fsize, *nofile, *nproc;
};

static int add_path(int ruleset, const char *path, uint64_t access, uint64_t handled) {
    int fd = open(path, O_PATH | O_CLOEXEC);
    /* A missing optional root grants nothing; so does one the shim may not open (the
     * program could not read it either: as root, it runs as another user). */
    if (fd < 0) return errno == ENOENT || errno == EACCES ? 0 : -1;
    struct ll_path_beneath rule = { access & handled, fd };
    long rc = syscall(SYS_ll_add, ruleset, LL_RULE_PATH_BENEATH, &rule, 0);
    if (rc != 0 && errno == EINVAL) {
        /* A regular file accepts only file rights. */
        rule.allowed &= (FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV);
        rc = syscall(SYS_ll_add, ruleset, LL_RULE_PATH_BENEATH, &rule, 0);
    }
    int saved = errno;
    close(fd);
    errno = saved;
    return rc == 0 ? 0 : -1;
}

/* A Landlock ruleset for the request's roots (-1: none asked for). Built before the
 * ids change: the roots are opened with the shim's own rights. */
static int landlock_ruleset(const struct request *r, long abi) {
    if (!r->nro && !r->nrw) return -1;
    if (abi < 1) return -1;
    uint64_t handled = FS_ALL_V1;
    if (abi >= 2) handled |= FS_REFER;
    if (abi >= 3) handled |= FS_TRUNCATE;
    if (abi >= 5) handled |= FS_IOCTL_DEV;
    struct ll_ruleset_attr attr = { handled, 0, 0 };
    size_t size = sizeof(uint64_t);
    if (r->deny_net && abi >= 4) { attr.net = NET_BIND_TCP | NET_CONNECT_TCP; size = 2 * sizeof(uint64_t); }
    if (abi >= 6) {  /* no signals to, or abstract sockets of, processes outside the sandbox */
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL;
        size = 3 * sizeof(uint64_t);
    }
    int rs = (int)syscall(SYS_ll_create, &attr, size, 0);
    if (rs < 0) die(126, "landlock_create_ruleset");
    uint64_t read_x = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR;
    for (int k = 0; k < r->nro; k++)
        if (add_path(rs, r->ro[k], read_x, handled) != 0) die(126, r->ro[k]);
    for (int k = 0; k < r->nrw; k++)
        if (add_path(rs, r->rw[k], handled, handled) != 0) die(126, r->rw[k]);
    return rs;
}

/* Keep only the capability `keep` (-1: none) in the effective, permitted and
 * inheritable sets, and in the ambient set so that it survives exec. (The bounding
 * set was emptied but for CAP_DAC_READ_SEARCH ahead: see drop_bounding_set.) */
static void only_cap(int keep) {
    struct cap_header h = { CAP_VERSION_3, 0 };
    struct cap_data d[2];
    memset(d, 0, sizeof d);
    if (keep >= 0) d[0].effective = d[0].permitted = d[0].inheritable = 1U << keep;
    if (syscall(SYS_capset, &h, d) != 0) die(126, "capset");
    if (keep >= 0 && prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, keep, 0, 0) != 0) die(126, "ambient");
}

/* The caller is root: the program runs as a.uid:a.gid, no supplementary groups. In a
 * user namespace those are its uid and gid 0 (so that access(2), which gcc uses on
 * TMPDIR, counts its capability below), made powerless: an empty bounding set, and
 * SECBIT_NOROOT, so that exec grants root nothing. Under Landlock (reads confined to
 * the declared roots) it keeps CAP_DAC_READ_SEARCH, which applies only to files of
 * ids mapped in its namespace (root's, its own): to read roots only root may read. */
static void drop_to(const struct ahead *a, int landlocked) {
    if (a->uid <= 0) return;
    uid_t uid = a->userns ? 0 : (uid_t)a->uid;
    gid_t gid = a->userns ? 0 : (gid_t)a->gid;
    if (setgroups(0, NULL) != 0) die(126, "setgroups");
    if (setresgid(gid, gid, gid) != 0) die(126, "setresgid");
    if (a->userns && prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0) die(126, "keepcaps");
    if (setresuid(uid, uid, uid) != 0) die(126, "setresuid");
    if (a->userns) {
        if (prctl(PR_SET_SECUREBITS, SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_KEEP_CAPS_LOCKED, 0, 0, 0) != 0)
            die(126, "securebits");
        only_cap(landlocked ? CAP_DAC_READ_SEARCH_ : -1);
    } else if (getuid() == 0 || geteuid() == 0) {  /* (the change of uid dropped every capability) */
        errno = EPERM;
        die(126, "still root");
    }
}

static void set_limit(int res, const char *val) {
    if (!val) return;
    rlim_t v = (rlim_t)number(val);
    struct rlimit rl = { v, v };
    struct rlimit cur;
    if (getrlimit(res, &cur) == 0 && cur.rlim_max != RLIM_INFINITY && rl.rlim_max > cur.rlim_max)
        rl.rlim_cur = rl.rlim_max = cur.rlim_max;
    if (setrlimit(res, &rl) != 0) die(126, "setrlimit");
}

/* In the program's process, started ahead (start_program): the walls that do not
 * depend on the run — its ids, no new privileges, the seccomp filter — in an order
 * that keeps each possible (seccomp last: it refuses what the steps before use). */
static void enter_walls_ahead(const struct ahead *a) {
    pid_t shim = getppid();
    drop_to(a, a->landlock >= 1);
    /* (reset by the change of ids; and the shim may have died meanwhile) */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) die(126, "pdeathsig");
    if (getppid() != shim) _exit(126);
    set_limit(RLIMIT_CORE, "0");
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) die(126, "no_new_privs");
    if (a->seccomp && syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER_, 0, &a->filter) != 0) die(126, "seccomp");
}

/* ... and, once the run is known, the rest: Landlock over its roots, its limits. */
static void enter_walls(const struct ahead *a, const struct request *r) {
    int rs = landlock_ruleset(r, a->landlock);
    if (rs < 0 && a->uid > 0 && a->userns) only_cap(-1);  /* no Landlock for this run: no read right either */
    set_limit(RLIMIT_AS, r->as);
    set_limit(RLIMIT_CPU, r->cpu);
    set_limit(RLIMIT_FSIZE, r->fsize);
    set_limit(RLIMIT_NOFILE, r->nofile);
    if (a->nproc) set_limit(RLIMIT_NPROC, r->nproc);
    if (rs >= 0) {
        if (syscall(SYS_ll_restrict, rs, 0) != 0) die(126, "landlock_restrict_self");
        close(rs);
    }
}

static volatile sig_atomic_t stopping = 0;
static void on_stop(int sig) { (void)sig; stopping = 1; }

/* SIGKILL every child of ours (the compiler, and whatever was reparented to us).
 * /proc/self/task/<tid>/children lists them directly; scanning /proc is the fallback. */
static int kill_children(void) {
    char path[300], buf[512];
    int killed = 0;
    pid_t self = getpid();
    snprintf(path, sizeof path, "/proc/self/task/%ld/children", (long)self);
    FILE *list = fopen(path, "re");
    if (list) {
        long pid;
        while (fscanf(list, "%ld", &pid) == 1) {
            kill((pid_t)pid, SIGKILL);
            killed++;
        }
        fclose(list);
        return killed;
    }
    DIR *proc = opendir("/proc");
    if (!proc) return 0;
    struct dirent *e;
    while ((e = readdir(proc)) != NULL) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n <= 0) continue;
        buf[n] = 0;
        char *rp = strrchr(buf, ')');  /* comm may hold spaces: ppid follows ") S " */
        long ppid = 0;
        if (rp && sscanf(rp + 2, "%*c %ld", &ppid) == 1 && ppid == self) {
            kill((pid_t)atol(e->d_name), SIGKILL);
            killed++;
        }
    }
    closedir(proc);
    return killed;
}

static int parse_request(int argc, char **argv, struct request *o);
static char **read_command(int fd, int *count, char **raw, size_t *raw_len);

/* Start the program's process ahead of the run: as a child subreaper we also inherit
 * anything it leaves behind (even after setsid), and kill all of it on the way out
 * (see supervise). It puts up the walls that do not depend on the run, then waits on
 * a pipe for the run's command (forwarded by the shim once the scratch is mounted),
 * puts up the rest and execs. Returns the pipe's write end. */
static int start_program(const struct ahead *a, pid_t *child) {
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) die(126, "subreaper");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    int go[2];
    if (pipe2(go, O_CLOEXEC) != 0) die(126, "pipe");
    *child = fork();
    if (*child < 0) die(126, "fork");
    if (*child == 0) {
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        close(go[1]);
        int null = open("/dev/null", O_RDONLY | O_CLOEXEC);  /* (not the runner's socket) */
        if (null < 0 || dup2(null, 0) < 0) die(126, "stdin");
        close(null);
        enter_walls_ahead(a);
        int n = 0;
        char **args = read_command(go[0], &n, NULL, NULL);
        static struct request r;
        int prog = parse_request(n, args, &r);
        if (prog >= n) { errno = EINVAL; die(124, "no program"); }
        if (r.cwd && chdir(r.cwd) != 0) die(126, "chdir");
        if (r.nenv) {
            r.env[r.nenv] = NULL;
            environ = (char **)r.env;
        }
        enter_walls(a, &r);
        execv(args[prog], &args[prog]);
        die(127, args[prog]);
    }
    close(go[0]);
    return go[1];
}

/* Wait for the program, then kill and reap everything it left behind — on its exit,
 * and on SIGTERM from the runner's timeout. */
static int supervise(pid_t child) {
    int code = 127;
    for (;;) {
        int st;
        pid_t p = waitpid(-1, &st, 0);
        if (p == child) { code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st); break; }
        if (p < 0 && errno == EINTR) { if (stopping) { code = 137; break; } continue; }
        if (p < 0) break;
    }
    /* Kill all children, reap one, repeat: an orphan reparented to us while we
     * wait is killed on the next round, never waited for. */
    for (long round = 0; round < 1000000; round++) {
        kill_children();
        if (waitpid(-1, NULL, 0) < 0 && errno == ECHILD && kill_children() == 0) break;
    }
    return code;
}

/* Parse the run's options up to "--"; returns the index of the program (argc when none). */
static int parse_request(int argc, char **argv, struct request *o) {
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) return i + 1;
        if (a[0] != '-' || a[1] == 0 || a[2] != 0) { errno = EINVAL; die(124, a); }
        if (a[1] == 'N') { o->deny_net = 1; continue; }
        if (i + 1 >= argc) { errno = EINVAL; die(124, a); }
        const char *v = argv[++i];
        switch (a[1]) {
        case 'a': number(v); o->as = v; break;
        case 'c': number(v); o->cpu = v; break;
        case 'f': number(v); o->fsize = v; break;
        case 'n': number(v); o->nofile = v; break;
        case 'p': number(v); o->nproc = v; break;
        case 'r': if (o->nro == MAX_PATHS) { errno = E2BIG; die(124, "-r"); } o->ro[o->nro++] = v; break;
        case 'w': if (o->nrw == MAX_PATHS) { errno = E2BIG; die(124, "-w"); } o->rw[o->nrw++] = v; break;
        case 'E': if (o->nenv == MAX_PATHS - 1) { errno = E2BIG; die(124, "-E"); } o->env[o->nenv++] = v; break;
        case 'C': o->cwd = v; break;
        case 'M': o->mount_dir = v; break;
        case 'H': o->hand_dir = v; break;
        default: errno = EINVAL; die(124, a);
        }
    }
    return argc;
}

static void parse_ahead(int argc, char **argv, struct ahead *a) {
    int from_stdin = 0;
    a->uid = a->gid = -1;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (o[0] != '-' || o[1] == 0 || o[2] != 0) { errno = EINVAL; die(124, o); }
        if (o[1] == 'R') { from_stdin = 1; continue; }
        if (o[1] == 'U') { a->userns = 1; continue; }
        if (i + 1 >= argc) { errno = EINVAL; die(124, o); }
        const char *v = argv[++i];
        switch (o[1]) {
        case 'T': number(v); a->scratch = 1; a->scratch_bytes = v; break;
        case 'i': number(v); a->scratch_inodes = v; break;
        case 'u': a->uid = (long long)number(v); break;
        case 'g': a->gid = (long long)number(v); break;
        case 'S': parse_filter(a, v); break;
        case 'L': a->preload = v; break;
        default: errno = EINVAL; die(124, o);
        }
    }
    if (!from_stdin || (a->scratch && !a->scratch_inodes) || ((a->uid < 0) != (a->gid < 0))) {
        errno = EINVAL;
        die(124, "usage: shim -R [-U] [-T BYTES -i INODES] [-u UID -g GID] [-S HEX] [-L FILE]");
    }
    if (a->uid == 0 || a->gid == 0) { errno = EINVAL; die(124, "-u/-g must not be root"); }
}

/* The run's command arrives on `fd` (stdin, a socket to the runner; the program's
 * process gets it from the shim on a pipe): a 4-byte little-endian length, then that
 * many bytes of NUL-terminated arguments. EOF before a command means the runner no
 * longer needs this shim: exit quietly. `raw`: the bytes as read, to forward. */
static char **read_command(int fd, int *count, char **raw, size_t *raw_len) {
    unsigned char head[4];
    size_t got = 0;
    while (got < sizeof head) {
        ssize_t n = read(fd, head + got, sizeof head - got);
        if (n == 0 && got == 0) _exit(0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && got == 0 && (errno == ECONNRESET || errno == EPIPE)) _exit(0);
        if (n <= 0) die(124, "request header");
        got += (size_t)n;
    }
    size_t len = head[0] | (head[1] << 8) | ((size_t)head[2] << 16) | ((size_t)head[3] << 24);
    if (len == 0 || len > (16u << 20)) { errno = EINVAL; die(124, "request length"); }
    char *buf = malloc(len + 4);
    if (!buf) die(126, "malloc");
    memcpy(buf, head, 4);
    for (got = 0; got < len;) {
        ssize_t n = read(fd, buf + 4 + got, len - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) die(124, "request body");
        got += (size_t)n;
    }
    char *body = buf + 4;
    if (body[len - 1] != 0) { errno = EINVAL; die(124, "request not NUL-terminated"); }
    int n = 0;
    for (size_t k = 0; k < len; k++) n += body[k] == 0;
    char **args = calloc((size_t)n + 1, sizeof *args);
    if (!args) die(126, "calloc");
    char *p = body;
    for (int k = 0; k < n; k++) { args[k] = p; p += strlen(p) + 1; }
    *count = n;
    if (raw) { *raw = buf; *raw_len = len + 4; }
    return args;
}

static int status_fd = -1;

static char **read_request(int *count, char **raw, size_t *raw_len) {
    char **args = read_command(0, count, raw, raw_len);
    /* The socket stays open (close-on-exec) for the exit report; stdin is /dev/null. */
    status_fd = fcntl(0, F_DUPFD_CLOEXEC, 3);
    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (status_fd < 0 || null < 0 || dup2(null, 0) < 0) die(126, "stdin");
    close(null);
    return args;
}

static void close_others(void) {
    /* Whatever was inherited beyond stdin, stdout and stderr (the descriptor this
     * program was executed through, among others) stays out of the compiler. */
    if (syscall(SYS_close_range, 3U, ~0U, 0U) == 0) return;
    long max = sysconf(_SC_OPEN_MAX);
    for (long fd = 3; fd < (max > 0 && max < 65536 ? max : 65536); fd++) close((int)fd);
}

int main(int argc, char **argv) {
    static struct ahead a;
    static struct request r;
    close_others();
    parse_ahead(argc, argv, &a);
    prepare(&a);
    if (a.preload) {  /* (inherited by the program: no close-on-exec) */
        int fd = open(a.preload, O_RDONLY | O_CLOEXEC);
        if (fd >= 0 && (fd == PRELOAD_FD || dup2(fd, PRELOAD_FD) == PRELOAD_FD)) {
            if (fd != PRELOAD_FD) close(fd);
            fcntl(PRELOAD_FD, F_SETFD, 0);
        } else if (fd >= 0) {
            close(fd);
        }
    }
    /* Not dumpable (once its own maps are written: that needs its /proc files): a
     * compiler of the same uid (the caller is not root) cannot reach into this process
     * through /proc/<pid>/mem (nor ptrace it: seccomp refuses that) to use its
     * capabilities in the namespace. (exec makes the program dumpable again.) */
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) die(126, "dumpable");
    report(&a);
    pid_t child = -1;
    int to_program = start_program(&a, &child);
    signal(SIGPIPE, SIG_IGN);  /* (here only: the program's process keeps the default) */
    int n = 0;
    char *raw = NULL;
    size_t raw_len = 0;
    char **args = read_request(&n, &raw, &raw_len);
    int prog = parse_request(n, args, &r);
    if (prog >= n) { errno = EINVAL; die(124, "no program"); }
    /* The program's ids in the scratch: as root with a user namespace, its uid 0 (the
     * unprivileged uid); the caller's own otherwise (nothing to change). */
    int own = a.uid > 0;
    uid_t uid = a.userns ? 0 : (uid_t)a.uid;
    gid_t gid = a.userns ? 0 : (gid_t)a.gid;
    int work = -1, scratch = -1, budget = MAX_ENTRIES;
    if (r.mount_dir) {
        if (a.mount_fd < 0) { errno = ENOSYS; die(125, "no scratch tmpfs for -M"); }
        work = open(r.mount_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        scratch = openat(a.mount_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (work < 0 || scratch < 0) die(126, "open the work dir");
        copy_in(work, scratch, own, uid, gid, 0, &budget);
        if (syscall(SYS_move_mount_, a.mount_fd, "", AT_FDCWD, r.mount_dir, MOVE_MOUNT_F_EMPTY_PATH_) != 0)
            die(126, "mount the scratch tmpfs");
    }
    if (a.mount_fd >= 0) close(a.mount_fd);
    if (r.hand_dir && own) {
        int dir = open(r.hand_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dir < 0) die(126, "open the work dir");
        hand_over(dir, uid, gid, 0, &budget);
        close(dir);
    }
    /* The program's process waits for the command; it goes on now the work dir is ready. */
    for (size_t done = 0; done < raw_len;) {
        ssize_t w = write(to_program, raw + done, raw_len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;  /* (it died: supervise reports how) */
        done += (size_t)w;
    }
    close(to_program);
    int code = supervise(child);
    if (scratch >= 0) copy_back(scratch, work);
    /* Everything it started is gone and reaped: say so now, so that the runner need
     * not wait for this process's own exit (and its namespaces' teardown). */
    char said[32];
    int len = snprintf(said, sizeof said, "exit %d\n", code);
    if (send(status_fd, said, (size_t)len, MSG_NOSIGNAL) < 0) { /* the runner is gone: nothing to tell */ }
    return code;
}
