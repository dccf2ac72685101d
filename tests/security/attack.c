/* A hostile "compiler" for the sandbox wall tests: `attack MODE ARGS...` tries one
 * thing and prints one line, "RESULT MODE ok ..." or "RESULT MODE errno=N (text)". */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/netlink.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <unistd.h>

static const char *mode;

static int result(int rc) {
    if (rc < 0) printf("RESULT %s errno=%d (%s)\n", mode, errno, strerror(errno));
    else printf("RESULT %s ok %d\n", mode, rc);
    fflush(stdout);
    return 0;
}

static int unix_addr(struct sockaddr_un *a, const char *path, int abstract) {
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    if (abstract) {
        strncpy(a->sun_path + 1, path, sizeof a->sun_path - 2);
        return (int)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(path));
    }
    strncpy(a->sun_path, path, sizeof a->sun_path - 1);
    return (int)sizeof *a;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    mode = argv[1];
    const char *arg = argc > 2 ? argv[2] : "";
    if (!strcmp(mode, "udp") || !strcmp(mode, "tcp")) {
        int udp = !strcmp(mode, "udp");
        int s = socket(AF_INET, udp ? SOCK_DGRAM : SOCK_STREAM, 0);
        if (s < 0) return result(-1);
        struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(arg)) };
        to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (udp) return result((int)sendto(s, "pwned", 5, 0, (struct sockaddr *)&to, sizeof to));
        return result(connect(s, (struct sockaddr *)&to, sizeof to));
    }
    if (!strcmp(mode, "unix") || !strcmp(mode, "abstract") || !strcmp(mode, "unix-dgram")) {
        int dgram = !strcmp(mode, "unix-dgram");
        int s = socket(AF_UNIX, dgram ? SOCK_DGRAM : SOCK_STREAM, 0);
        if (s < 0) return result(-1);
        struct sockaddr_un a;
        int len = unix_addr(&a, arg, !strcmp(mode, "abstract"));
        if (dgram) return result((int)sendto(s, "pwned", 5, 0, (struct sockaddr *)&a, (socklen_t)len));
        if (connect(s, (struct sockaddr *)&a, (socklen_t)len) < 0) return result(-1);
        return result((int)write(s, "pwned", 5));
    }
    if (!strcmp(mode, "socketpair")) {  /* an unnamed pair, then a datagram to a named socket */
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_DGRAM, 0, sv) < 0) return result(-1);
        struct sockaddr_un a;
        int len = unix_addr(&a, arg, 0);
        return result((int)sendto(sv[0], "pwned", 5, 0, (struct sockaddr *)&a, (socklen_t)len));
    }
    if (!strcmp(mode, "netlink")) return result(socket(AF_NETLINK, SOCK_RAW, NETLINK_ROUTE));
    if (!strcmp(mode, "raw")) return result(socket(AF_INET, SOCK_RAW, IPPROTO_ICMP));
    if (!strcmp(mode, "packet")) return result(socket(17 /* AF_PACKET */, SOCK_RAW, 0));
    if (!strcmp(mode, "inet6")) return result(socket(AF_INET6, SOCK_DGRAM, 0));
    if (!strcmp(mode, "io_uring")) {
        char params[120];
        memset(params, 0, sizeof params);
        return result((int)syscall(425 /* io_uring_setup */, 4, params));
    }
    if (!strcmp(mode, "unshare")) return result(unshare(CLONE_NEWUSER | CLONE_NEWNET));
    if (!strcmp(mode, "clone-ns")) {
        long pid = syscall(SYS_clone, CLONE_NEWUSER | CLONE_NEWNET | SIGCHLD, 0, 0, 0, 0);
        if (pid == 0) _exit(0);
        if (pid > 0) waitpid((pid_t)pid, NULL, 0);
        return result((int)pid);
    }
    if (!strcmp(mode, "umount")) return result(umount2(arg, MNT_DETACH));
    if (!strcmp(mode, "ptrace")) return result((int)ptrace(PTRACE_ATTACH, (pid_t)atoi(arg), 0, 0));
    if (!strcmp(mode, "vmread")) {
        char buf[8];
        struct iovec local = { buf, sizeof buf }, remote = { (void *)0x400000, sizeof buf };
        return result((int)process_vm_readv((pid_t)atoi(arg), &local, 1, &remote, 1, 0));
    }
    if (!strcmp(mode, "fill")) {  /* fill COUNT SIZE: COUNT files of SIZE bytes each in the cwd */
        int count = atoi(arg);
        long size = atol(argv[3]);
        char *block = calloc(1, 1 << 16);
        long total = 0;
        for (int i = 0; i < count; i++) {
            char name[32];
            snprintf(name, sizeof name, "fill%d", i);
            int fd = open(name, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            if (fd < 0) break;
            for (long done = 0; done < size;) {
                ssize_t n = write(fd, block, (size_t)(size - done < (1 << 16) ? size - done : (1 << 16)));
                if (n <= 0) { i = count; break; }
                done += n;
                total += n;
            }
            close(fd);
        }
        printf("WROTE %ld\n", total);
        return result(0);
    }
    if (!strcmp(mode, "files")) {  /* files COUNT: empty files until it fails */
        int made = 0;
        for (int i = 0; i < atoi(arg); i++) {
            char name[32];
            snprintf(name, sizeof name, "e%d", i);
            int fd = open(name, O_WRONLY | O_CREAT, 0600);
            if (fd < 0) break;
            close(fd);
            made++;
        }
        printf("MADE %d\n", made);
        return result(0);
    }
    if (!strcmp(mode, "forks")) {  /* forks COUNT: children that wait, until fork fails */
        int made = 0, err = 0;
        int gate[2];
        if (pipe(gate) != 0) return result(-1);
        for (int i = 0; i < atoi(arg); i++) {
            pid_t pid = fork();
            if (pid == 0) { char c; close(gate[1]); (void)!read(gate[0], &c, 1); _exit(0); }
            if (pid < 0) { err = errno; break; }
            made++;
        }
        close(gate[1]);
        while (wait(NULL) > 0) {}
        printf("FORKED %d\n", made);
        errno = err;
        return result(err ? -1 : made);
    }
    if (!strcmp(mode, "ids")) {  /* who it runs as (no /proc: Landlock keeps it out), and a file it made */
        int fd = open("owned-by-compiler", O_WRONLY | O_CREAT, 0600);
        if (fd >= 0) close(fd);
        uid_t r, e, s;
        getresuid(&r, &e, &s);
        printf("Uid: %u %u %u\n", r, e, s);
        printf("Groups: %d\n", getgroups(0, NULL));
        struct { uint32_t version; int pid; } h = { 0x20080522, 0 };
        struct { uint32_t eff, prm, inh; } d[2];
        memset(d, 0, sizeof d);
        syscall(SYS_capget, &h, d);
        unsigned long long bnd = 0, amb = 0;
        for (int c = 0; c < 64; c++) {
            if (prctl(PR_CAPBSET_READ, c, 0, 0, 0) == 1) bnd |= 1ULL << c;
            if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, c, 0, 0) == 1) amb |= 1ULL << c;
        }
        printf("CapEff: %llx\nCapPrm: %llx\nCapInh: %llx\nCapBnd: %llx\nCapAmb: %llx\n",
               d[0].eff | (unsigned long long)d[1].eff << 32, d[0].prm | (unsigned long long)d[1].prm << 32,
               d[0].inh | (unsigned long long)d[1].inh << 32, bnd, amb);
        printf("NoNewPrivs: %d\nSeccomp: %d\n", prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0), prctl(PR_GET_SECCOMP, 0, 0, 0, 0));
        return result(0);
    }
    if (!strcmp(mode, "append")) {  /* append PATH: write to an existing file */
        int fd = open(arg, O_WRONLY | O_APPEND);
        if (fd < 0) return result(-1);
        return result((int)write(fd, "pwned\n", 6));
    }
    if (!strcmp(mode, "alloc")) {  /* alloc MIB: that much memory, touched */
        size_t size = (size_t)atol(arg) << 20;
        char *p = malloc(size);
        if (!p) return result(-1);
        memset(p, 1, size);
        return result(0);
    }
    if (!strcmp(mode, "signal")) return result(kill((pid_t)atoi(arg), SIGTERM));
    if (!strcmp(mode, "sigkill-self")) { kill(getpid(), SIGKILL); return 1; }
    if (!strcmp(mode, "straggler")) {  /* a daemon keeps the output pipe; the program exits */
        if (fork() == 0) { setsid(); if (fork() == 0) { sleep(100); _exit(0); } _exit(0); }
        wait(NULL);
        return result(0);
    }
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
}
