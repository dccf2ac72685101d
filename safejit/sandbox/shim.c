/* safejit exec shim: applies rlimits and a Landlock ruleset, then execs.
 *
 *   shim [-a AS] [-c CPU_S] [-f FSIZE] [-n NOFILE] [-r RO_PATH]... [-w RW_PATH]...
 *        [-N] [-L] [-C DIR] [-E NAME=VALUE]... -- PROGRAM ARGS...
 *   shim -R        (the same arguments, read from stdin: see read_request)
 *
 * -C changes to DIR; -E, given at all, replaces the environment with its entries.
 * -N denies TCP bind/connect where the Landlock ABI allows it (>= 4).
 * -L makes Landlock mandatory: exit 125 when the kernel does not offer it.
 * Without -r/-w no Landlock ruleset is applied. Exit codes 124-127 are the
 * shim's own (124 bad usage, 125 sandbox unavailable, 126 setup failed,
 * 127 exec failed); the message goes to stderr.
 *
 * The program runs as the shim's child; the shim is a child subreaper, so
 * nothing the compiler starts can outlive it (see supervise()). SIGTERM makes
 * it kill everything and exit 137.
 *
 * Built once per user by safejit.policy.sandbox with the system C compiler.
 * It runs between fork and the compiler, so there is no preexec_fn.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
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

struct ll_ruleset_attr { uint64_t fs; uint64_t net; uint64_t scoped; };
struct ll_path_beneath { uint64_t allowed; int32_t parent_fd; } __attribute__((packed));

#define MAX_PATHS 256

static void die(int code, const char *what) {
    fprintf(stderr, "safejit-shim: %s: %s\n", what, strerror(errno));
    _exit(code);
}

static void set_limit(int res, const char *val) {
    char *end = NULL;
    unsigned long long v = strtoull(val, &end, 10);
    if (!end || *end) { errno = EINVAL; die(124, "bad limit"); }
    struct rlimit rl = { (rlim_t)v, (rlim_t)v };
    struct rlimit cur;
    if (getrlimit(res, &cur) == 0 && cur.rlim_max != RLIM_INFINITY && rl.rlim_max > cur.rlim_max)
        rl.rlim_cur = rl.rlim_max = cur.rlim_max;
    if (setrlimit(res, &rl) != 0) die(126, "setrlimit");
}

static int add_path(int ruleset, const char *path, uint64_t access, uint64_t handled) {
    int fd = open(path, O_PATH | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? 0 : -1; /* a missing optional root is fine */
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

struct sandbox { const char **ro, **rw; int nro, nrw, deny_net, required; };

/* Restrict this process (the child about to exec the compiler) with Landlock. */
static void apply_landlock(const struct sandbox *b) {
    const char **ro = b->ro, **rw = b->rw;
    int nro = b->nro, nrw = b->nrw, deny_net = b->deny_net, required = b->required;
    if (nro || nrw || required) {
        long abi = syscall(SYS_ll_create, NULL, 0, LL_VERSION);
        if (abi < 1) {
            if (required) die(125, "landlock unavailable");
        } else {
            uint64_t handled = FS_ALL_V1;
            if (abi >= 2) handled |= FS_REFER;
            if (abi >= 3) handled |= FS_TRUNCATE;
            if (abi >= 5) handled |= FS_IOCTL_DEV;
            struct ll_ruleset_attr attr = { handled, 0, 0 };
            size_t size = sizeof(uint64_t);
            if (deny_net && abi >= 4) { attr.net = NET_BIND_TCP | NET_CONNECT_TCP; size = 2 * sizeof(uint64_t); }
            if (abi >= 6) {  /* no signals to, or abstract sockets of, processes outside the sandbox */
                attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL;
                size = 3 * sizeof(uint64_t);
            }
            int rs = (int)syscall(SYS_ll_create, &attr, size, 0);
            if (rs < 0) die(126, "landlock_create_ruleset");
            uint64_t read_x = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR;
            for (int k = 0; k < nro; k++)
                if (add_path(rs, ro[k], read_x, handled) != 0) die(126, ro[k]);
            for (int k = 0; k < nrw; k++)
                if (add_path(rs, rw[k], handled, handled) != 0) die(126, rw[k]);
            if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) die(126, "no_new_privs");
            if (syscall(SYS_ll_restrict, rs, 0) != 0) die(126, "landlock_restrict_self");
            close(rs);
        }
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

/* Run the program as a child and reap it; as a child subreaper we also inherit
 * anything it leaves behind (even after setsid), and kill all of it on the way
 * out — on normal exit and on SIGTERM from the runner's timeout. */
static int supervise(char **prog, const struct sandbox *box) {
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) die(126, "subreaper");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    pid_t child = fork();
    if (child < 0) die(126, "fork");
    if (child == 0) {
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
        apply_landlock(box);
        execv(prog[0], prog);
        die(127, prog[0]);
    }
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

struct options {
    const char *ro[MAX_PATHS], *rw[MAX_PATHS], *env[MAX_PATHS];
    int nro, nrw, nenv, deny_net, required, from_stdin;
    const char *cwd;
};

/* Parse options up to "--"; returns the index of the program (argc when there is none). */
static int parse(int argc, char **argv, int i, struct options *o) {
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) return i + 1;
        if (a[0] != '-' || a[1] == 0 || a[2] != 0) { errno = EINVAL; die(124, a); }
        switch (a[1]) {
        case 'N': o->deny_net = 1; continue;
        case 'L': o->required = 1; continue;
        case 'R': o->from_stdin = 1; continue;
        default: break;
        }
        if (i + 1 >= argc) { errno = EINVAL; die(124, a); }
        const char *v = argv[++i];
        switch (a[1]) {
        case 'a': set_limit(RLIMIT_AS, v); break;
        case 'c': set_limit(RLIMIT_CPU, v); break;
        case 'f': set_limit(RLIMIT_FSIZE, v); break;
        case 'n': set_limit(RLIMIT_NOFILE, v); break;
        case 'r': if (o->nro == MAX_PATHS) { errno = E2BIG; die(124, "-r"); } o->ro[o->nro++] = v; break;
        case 'w': if (o->nrw == MAX_PATHS) { errno = E2BIG; die(124, "-w"); } o->rw[o->nrw++] = v; break;
        case 'E': if (o->nenv == MAX_PATHS - 1) { errno = E2BIG; die(124, "-E"); } o->env[o->nenv++] = v; break;
        case 'C': o->cwd = v; break;
        default: errno = EINVAL; die(124, a);
        }
    }
    return argc;
}

/* -R: the rest of the command line arrives on stdin, so the shim can be started
 * before it is needed: a 4-byte little-endian length, then that many bytes of
 * NUL-terminated arguments. stdin is /dev/null again afterwards. EOF before a
 * request means the runner no longer needs this shim: exit quietly. */
static char **read_request(int *count) {
    unsigned char head[4];
    size_t got = 0;
    while (got < sizeof head) {
        ssize_t n = read(0, head + got, sizeof head - got);
        if (n == 0 && got == 0) _exit(0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) die(124, "request header");
        got += (size_t)n;
    }
    size_t len = head[0] | (head[1] << 8) | ((size_t)head[2] << 16) | ((size_t)head[3] << 24);
    if (len == 0 || len > (16u << 20)) { errno = EINVAL; die(124, "request length"); }
    char *buf = malloc(len + 1);
    if (!buf) die(126, "malloc");
    for (got = 0; got < len;) {
        ssize_t n = read(0, buf + got, len - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) die(124, "request body");
        got += (size_t)n;
    }
    if (buf[len - 1] != 0) { errno = EINVAL; die(124, "request not NUL-terminated"); }
    int n = 0;
    for (size_t k = 0; k < len; k++) n += buf[k] == 0;
    char **args = calloc((size_t)n + 1, sizeof *args);
    if (!args) die(126, "calloc");
    char *p = buf;
    for (int k = 0; k < n; k++) { args[k] = p; p += strlen(p) + 1; }
    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null < 0 || dup2(null, 0) < 0) die(126, "stdin");
    close(null);
    *count = n;
    return args;
}

int main(int argc, char **argv) {
    static struct options o;
    int prog = parse(argc, argv, 1, &o);
    if (o.from_stdin) {
        int n = 0;
        argv = read_request(&n);
        argc = n;
        prog = parse(argc, argv, 0, &o);
    }
    if (prog >= argc) { errno = EINVAL; die(124, "no program"); }
    if (o.cwd && chdir(o.cwd) != 0) die(126, "chdir");
    if (o.nenv) {
        o.env[o.nenv] = NULL;
        environ = (char **)o.env;
    }
    struct sandbox box = { o.ro, o.rw, o.nro, o.nrw, o.deny_net, o.required };
    return supervise(&argv[prog], &box);
}
