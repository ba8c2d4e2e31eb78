/*
 * psbatch's compiled front end: psbatch at about sbatch's own cost.
 *
 * It reads the job's script the way pipeswift_slurm/submit/psbatch.py does (read_source: the last
 * --wrap, else the script file, else stdin when sbatch would read it). When the text holds
 * none of psbatch's markers, it execs the real sbatch with argv unchanged (and, when it
 * read stdin, the same bytes on stdin). Otherwise, and whenever a --pipeswift option is
 * present, it decides what the Python psbatch would do itself (decide.c) when it can, and
 * else asks psbatch's resident helper (pipeswift_slurm/submit/helper.py); then does it:
 * exec sbatch with the new argv, the rewritten script on stdin or in a file in the
 * helper's folder. With no helper (the first time: it starts one in the background), or
 * anything amiss, it execs the Python psbatch with the same argv and stdin, and the real
 * sbatch in $PIPESWIFT_SBATCH. Nothing is submitted before that choice, so the outcome is
 * the Python psbatch's in every case.
 *
 * Every table (sbatch's options, the markers, Megatron's flags, the size bound, messages,
 * the interpreter) comes from psbatch_tables.h, which pipeswift_slurm/submit/fast/build.py
 * generates from the Python modules: `pipeswift build-psbatch` or `python -m
 * pipeswift_slurm.submit.fast.build`. Plain C99 + POSIX/Linux, no libraries.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "decide.h"
#include "psbatch_tables.h"

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif

/* ------------------------------------------------------------------ argv */

struct scan {
    int script_index;   /* into argv (argv[0] is the program), -1: none */
    int has_wrap;
    const char *wrap;   /* last --wrap value; NULL when it had none */
    int unknown;        /* an option sbatch does not know (sbatch judges it) */
    int no_stdin;       /* an option after which sbatch reads no script */
    unsigned char *own; /* own[i]: argv[i] is (part of) a --pipeswift option */
};

/* One option of psbatch's argv: what main() needs to know of it. */
static void take(const struct psb_opt *o, void *ctx)
{
    struct scan *s = ctx;
    int k;
    if (o->what == PSB_OPT_OWN) {
        for (k = o->start; k < o->end; k++)
            s->own[k + 1] = 1;
        return;
    }
    if (o->what == PSB_OPT_UNKNOWN) {
        s->unknown = 1;
        return;
    }
    if (strcmp(o->name, "wrap") == 0) {
        s->has_wrap = 1;
        s->wrap = o->value;
    }
    for (k = 0; psb_no_stdin[k]; k++)
        if (strcmp(o->name, psb_no_stdin[k]) == 0)
            s->no_stdin = 1;
}

/* sbatch_args.scan_argv: options up to the first positional word (the script) or "--". */
static void scan_argv(int argc, char **argv, struct scan *s)
{
    int script = psb_scan_options(argc - 1, argv + 1, 1, take, s, NULL);
    s->script_index = script < 0 ? -1 : script + 1;
}

/* ------------------------------------------------------------------ input */

struct buf {
    char *data;
    size_t len, cap;
};

/* Make room for `room` more bytes in `b` (doubling). -1 when out of memory. */
static int buf_reserve(struct buf *b, size_t room)
{
    size_t cap = b->cap ? b->cap : 4096;
    char *grown;
    if (b->cap - b->len >= room)
        return 0;
    while (cap - b->len < room)
        cap *= 2;
    grown = realloc(b->data, cap);
    if (grown == NULL)
        return -1;
    b->data = grown;
    b->cap = cap;
    return 0;
}

/* Read fd to EOF, or until more than `limit` bytes (0: no limit). -1 on a read error. */
static int read_all(int fd, struct buf *b, size_t limit)
{
    for (;;) {
        ssize_t n;
        size_t want;
        if (limit && b->len > limit)
            return 0;
        /* a script is a few KB: start at 4 KB (no mmap, few pages touched), then double */
        if (b->cap - b->len < 1024 && buf_reserve(b, b->cap ? b->cap : 4096) != 0)
            return -1;
        want = b->cap - b->len;
        if (limit && want > limit + 1 - b->len)
            want = limit + 1 - b->len;
        n = read(fd, b->data + b->len, want);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (n == 0)
            return 0;
        b->len += (size_t)n;
    }
}

static int has_marker(const char *text, size_t len)
{
    int k;
    for (k = 0; psb_markers[k]; k++)
        if (memmem(text, len, psb_markers[k], strlen(psb_markers[k])) != NULL)
            return 1;
    return 0;
}

static int write_all(int fd, const char *data, size_t len)
{
    while (len) {
        ssize_t n = write(fd, data, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

static int tmp_fd(void)
{
    int fd = -1;
#ifdef SYS_memfd_create
#ifndef MFD_CLOEXEC
#define MFD_CLOEXEC 0x0001U
#endif
    fd = (int)syscall(SYS_memfd_create, "psbatch-stdin", MFD_CLOEXEC);
#endif
    if (fd < 0) {
        const char *dir = getenv("TMPDIR");
        char path[PATH_MAX];
        if (dir == NULL || *dir == '\0')
            dir = "/tmp";
        if (snprintf(path, sizeof path, "%s/psbatch-stdin-XXXXXX", dir) < (int)sizeof path) {
            fd = mkstemp(path);
            if (fd >= 0)
                unlink(path);
        }
    }
    return fd;
}

/* Make fd 0 deliver exactly these bytes again (sbatch or Python reads them next). */
static int restore_stdin(const struct buf *b)
{
    int fd = tmp_fd();
    if (fd >= 0) {
        if (write_all(fd, b->data, b->len) == 0 && lseek(fd, 0, SEEK_SET) == 0 && dup2(fd, 0) == 0) {
            close(fd);
            return 0;
        }
        close(fd);
    }
    { /* no memfd and no writable temp folder: feed a pipe from a child */
        int p[2];
        pid_t pid;
        if (pipe(p) != 0)
            return -1;
        pid = fork();
        if (pid == 0) {
            close(p[0]);
            _exit(write_all(p[1], b->data, b->len) == 0 ? 0 : 1);
        }
        close(p[1]);
        if (pid < 0 || dup2(p[0], 0) != 0) {
            close(p[0]);
            return -1;
        }
        close(p[0]);
        return 0;
    }
}

/* ------------------------------------------------------------------ running */

static int executable_file(const char *path, struct stat *st)
{
    return stat(path, st) == 0 && S_ISREG(st->st_mode) && access(path, X_OK) == 0;
}

/* This binary, looked up only when a candidate sbatch might be it. */
struct self {
    const char *argv0;
    int looked;
    int have_exe;       /* 1: exe holds /proc/self/exe's stat, -1: none, 0: not looked yet */
    struct stat exe;
    char *path;         /* its real path (NULL: unknown), once looked */
    char buf[PATH_MAX];
};

static char *search_path(const char *name, struct self *skip);

/* This binary's real path: /proc/self/exe, else argv[0] as the shell found it. */
static const char *self_path(struct self *me)
{
    char *found;
    const char *argv0 = me->argv0;
    if (me->looked)
        return me->path;
    me->looked = 1;
    if (realpath("/proc/self/exe", me->buf))
        return me->path = me->buf;
    if (argv0 == NULL || *argv0 == '\0')
        return NULL;
    if (strchr(argv0, '/'))
        return me->path = realpath(argv0, me->buf);
    found = search_path(argv0, NULL);
    if (found && realpath(found, me->buf))
        me->path = me->buf;
    free(found);
    return me->path;
}

/* Whether the executable `candidate` (its stat in `st`) is this binary: the same real path.
 * Real paths are compared only for the file /proc/self/exe is (or without /proc): another
 * file has another real path, and resolving one costs a system call per path component. */
static int is_self(const char *candidate, const struct stat *st, struct self *me)
{
    char real[PATH_MAX];
    const char *mine;
    if (me->have_exe == 0)
        me->have_exe = stat("/proc/self/exe", &me->exe) == 0 ? 1 : -1;
    if (me->have_exe == 1 && (me->exe.st_dev != st->st_dev || me->exe.st_ino != st->st_ino))
        return 0;
    mine = self_path(me);
    return mine && realpath(candidate, real) && strcmp(real, mine) == 0;
}

/* The first executable `name` in $PATH (os.defpath when unset; "" is "."), as
 * os.path.join builds it, that is not this binary when `skip`; NULL when none. */
static char *search_path(const char *name, struct self *skip)
{
    const char *path = getenv("PATH");
    size_t nlen = strlen(name);
    struct stat st;
    if (path == NULL)
        path = PSB_DEFPATH;
    for (;;) {
        const char *end = strchr(path, ':');
        size_t flen = end ? (size_t)(end - path) : strlen(path);
        const char *folder = flen ? path : ".";
        size_t dlen = flen ? flen : 1;
        char *candidate = malloc(dlen + nlen + 2);
        if (candidate == NULL)
            return NULL;
        memcpy(candidate, folder, dlen);
        if (folder[dlen - 1] != '/')
            candidate[dlen++] = '/';
        memcpy(candidate + dlen, name, nlen + 1);
        if (executable_file(candidate, &st) && !(skip && is_self(candidate, &st, skip)))
            return candidate;
        free(candidate);
        if (end == NULL)
            return NULL;
        path = end + 1;
    }
}

/* psbatch.find_sbatch: $PIPESWIFT_SBATCH, else the first sbatch on PATH that is not me. */
static char *find_sbatch(struct self *me)
{
    const char *wanted = getenv("PIPESWIFT_SBATCH");
    struct stat st;
    if (wanted == NULL || *wanted == '\0')
        wanted = "sbatch";
    if (strchr(wanted, '/'))
        return executable_file(wanted, &st) ? strdup(wanted) : NULL;
    return search_path(wanted, me);
}

static void exec_sbatch(const char *sbatch, char **argv)
{
    argv[0] = "sbatch"; /* as typed: sbatch's messages name it */
    execv(sbatch, argv);
    fprintf(stderr, "psbatch: error: cannot run %s: %s\n", sbatch, strerror(errno));
    exit(126);
}

/* Whether a --pipeswift option asks for psbatch's report (--pipeswift=check, as
 * strip_own_options reads it): only the Python psbatch writes it, and nothing is submitted. */
static int asks_check(int argc, char **argv, const struct scan *s)
{
    size_t plen = strlen(PSB_OWN_PREFIX);
    int i;
    for (i = 1; i < argc; i++) {
        const char *rest;
        if (!s->own[i] || strncmp(argv[i], PSB_OWN_PREFIX, plen) != 0)
            continue;
        rest = argv[i] + plen;
        while (*rest == '-')
            rest++;
        if (*rest == '=' && strcmp(rest + 1, PSB_CHECK_VALUE) == 0)
            return 1;
        if (*rest == '\0' && rest > argv[i] + plen && i + 1 < argc && s->own[i + 1] &&
            strcmp(argv[i + 1], PSB_CHECK_VALUE) == 0) /* --pipeswift- check; bare --pipeswift takes no value */
            return 1;
    }
    return 0;
}

/* Hand the submission to the Python psbatch; if it cannot start, submit unchanged (a
 * check submits nothing: it fails). */
static void exec_python(int argc, char **argv, const char *sbatch, const struct scan *s)
{
    const char *saved = getenv("PIPESWIFT_SBATCH");
    char *old = saved ? strdup(saved) : NULL;
    char **args = malloc(((size_t)argc + 8) * sizeof *args);
    int n = 0, i, err;
    if (args == NULL) {
        fputs("psbatch: error: out of memory\n", stderr);
        exit(1);
    }
    args[n++] = (char *)PSB_PYTHON;
    for (i = 0; psb_python_flags[i]; i++)
        args[n++] = (char *)psb_python_flags[i];
    for (i = 1; i < argc; i++)
        args[n++] = argv[i];
    args[n] = NULL;
    setenv("PIPESWIFT_SBATCH", sbatch, 1);
    execv(PSB_PYTHON, args);
    err = errno;
    if (old)
        setenv("PIPESWIFT_SBATCH", old, 1);
    else
        unsetenv("PIPESWIFT_SBATCH");
    if (asks_check(argc, argv, s)) {
        fprintf(stderr, "psbatch: error: %s=%s needs the Python psbatch, which cannot run (%s: %s);"
                " nothing submitted\n", PSB_OWN_PREFIX, PSB_CHECK_VALUE, PSB_PYTHON, strerror(err));
        exit(2);
    }
    fprintf(stderr, "%scannot run the Python psbatch (%s: %s)%s", PSB_WARN_PREFIX, PSB_PYTHON,
            strerror(err), PSB_WARN_SUFFIX);
    for (i = 1, n = 1; i < argc; i++)  /* without psbatch's own options, as Python would */
        if (!s->own[i])
            argv[n++] = argv[i];
    argv[n] = NULL;
    exec_sbatch(sbatch, argv);
}

static char *sbatch_or_exit(struct self *me)
{
    char *sbatch = find_sbatch(me);
    if (sbatch == NULL) {
        fputs(PSB_NO_SBATCH_MESSAGE, stderr);
        exit(PSB_NO_SBATCH_RC);
    }
    return sbatch;
}

/* ------------------------------------------------------------------ the resident helper */

enum { HELPER_ABSENT = 1, HELPER_UNUSABLE = 2 };
#define HELPER_SPIN_US 3000L

static int buf_add(struct buf *b, const void *data, size_t len)
{
    if (buf_reserve(b, len) != 0)
        return -1;
    if (len)
        memcpy(b->data + b->len, data, len);
    b->len += len;
    return 0;
}

/* psbatch_helper's record head: a tag byte, then the length as 4 bytes, big-endian. */
static int put_head(struct buf *b, char tag, size_t len)
{
    unsigned char head[5];
    if (len > 0xffffffffUL)
        return -1;
    head[0] = (unsigned char)tag;
    head[1] = (unsigned char)(len >> 24);
    head[2] = (unsigned char)(len >> 16);
    head[3] = (unsigned char)(len >> 8);
    head[4] = (unsigned char)len;
    return buf_add(b, head, sizeof head);
}

/* psbatch_helper's record: the head, then the bytes. */
static int put_record(struct buf *b, char tag, const char *data, size_t len)
{
    return put_head(b, tag, len) || buf_add(b, data, len) ? -1 : 0;
}

/* A switch in the environment: off, 0, no or false turn it off; any other value on; unset
 * or empty: `default_on`. */
static int switched_on(const char *variable, int default_on)
{
    const char *v = getenv(variable);
    if (v == NULL || *v == '\0')
        return default_on;
    return !(strcmp(v, "off") == 0 || strcmp(v, "0") == 0 || strcmp(v, "no") == 0 || strcmp(v, "false") == 0);
}

/* $PIPESWIFT_PSBATCH_HELPER; unset or empty: as built (pipeswift build-psbatch --no-helper). */
static int helper_enabled(void)
{
    return switched_on("PIPESWIFT_PSBATCH_HELPER", PSB_HELPER_DEFAULT_ON);
}

/* psbatch_helper.shared_memory_usable */
static int shared_memory_usable(void)
{
    struct stat st;
    return stat(PSB_SHARED_MEMORY, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & S_ISVTX) &&
           access(PSB_SHARED_MEMORY, W_OK | X_OK) == 0;
}

/* psbatch_helper.helper_dir */
static int helper_dir(char *out, size_t size)
{
    const char *dir = getenv("PIPESWIFT_PSBATCH_HELPER_DIR");
    const char *runtime = getenv("XDG_RUNTIME_DIR");
    int n;
    if (dir && *dir)
        n = snprintf(out, size, "%s", dir);
    else if (runtime && runtime[0] == '/')
        n = snprintf(out, size, "%s/pipeswift", runtime);
    else if (shared_memory_usable())
        n = snprintf(out, size, "%s/pipeswift-%lu", PSB_SHARED_MEMORY, (unsigned long)getuid());
    else
        n = snprintf(out, size, "/tmp/pipeswift-%lu", (unsigned long)getuid());
    return n > 0 && (size_t)n < size;
}

/* Mine, a folder, and nobody else's: 0 (missing: HELPER_ABSENT; else HELPER_UNUSABLE). */
static int private_dir(const char *dir)
{
    struct stat st;
    if (lstat(dir, &st) != 0)
        return errno == ENOENT ? HELPER_ABSENT : HELPER_UNUSABLE;
    return S_ISDIR(st.st_mode) && st.st_uid == getuid() && (st.st_mode & 077) == 0 ? 0 : HELPER_UNUSABLE;
}

/* Start the helper in the background, detached, for the next submissions. */
static void start_helper(const char *dir)
{
    const char *args[16];
    int n = 0, i;
    pid_t pid;
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return;
    if (private_dir(dir) != 0)
        return;
    args[n++] = PSB_PYTHON;
    for (i = 0; psb_helper_flags[i] && n < 12; i++)
        args[n++] = psb_helper_flags[i];
    args[n++] = "serve";
    args[n++] = "--dir";
    args[n++] = dir;
    args[n] = NULL;
    pid = fork();
    if (pid == 0) {
        int fd, null = open("/dev/null", O_RDWR);
        if (null < 0 || setsid() < 0 || chdir("/") != 0)
            _exit(1);
        if (fork() != 0)
            _exit(0);
        dup2(null, 0);
        dup2(null, 1);
        dup2(null, 2);
        for (fd = 3; fd < 1024; fd++) /* keep no pipe of the caller's open */
            close(fd);
        execv(PSB_PYTHON, (char *const *)args);
        _exit(127);
    }
    if (pid > 0)
        waitpid(pid, NULL, 0);
}

static int helper_connect(const char *dir)
{
    struct sockaddr_un addr;
    struct timeval tv = {PSB_HELPER_TIMEOUT_S, 0};
    struct ucred peer;
    socklen_t len = sizeof peer;
    int fd;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    if (snprintf(addr.sun_path, sizeof addr.sun_path, "%s/%s", dir, PSB_HELPER_SOCKET) >= (int)sizeof addr.sun_path)
        return -HELPER_UNUSABLE;
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -HELPER_UNUSABLE;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        int absent = errno == ENOENT || errno == ECONNREFUSED;
        close(fd);
        return absent ? -HELPER_ABSENT : -HELPER_UNUSABLE;
    }
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || peer.uid != getuid()) {
        close(fd);
        return -HELPER_UNUSABLE;
    }
    return fd;
}

/* Wait until the helper's answer can be read, polling for up to `spin_us` (the helper
 * answers a new script in about a millisecond): a process that blocks lets its CPU go
 * idle, and waking it again cost about 0.1 ms on a virtual machine. Each poll yields the
 * CPU, so on a machine with one free CPU the helper still gets it. After that, reads
 * block (up to the socket's timeout). */
static void await_answer(int fd, long spin_us)
{
    struct pollfd p;
    struct timespec start, now;
    p.fd = fd;
    p.events = POLLIN;
    if (clock_gettime(CLOCK_MONOTONIC, &start) != 0)
        return;
    for (;;) {
        p.revents = 0;
        if (poll(&p, 1, 0) != 0 || clock_gettime(CLOCK_MONOTONIC, &now) != 0 ||
            (now.tv_sec - start.tv_sec) * 1000000L + (now.tv_nsec - start.tv_nsec) / 1000 > spin_us)
            return;
        sched_yield();
    }
}

static char *word(const char *data, size_t len)
{
    char *w;
    if (memchr(data, '\0', len))
        return NULL;
    w = malloc(len + 1);
    if (w) {
        memcpy(w, data, len);
        w[len] = '\0';
    }
    return w;
}

/* One record of `b` at *at: its tag, bytes and length; -1 when none is whole. */
static int next_record(const struct buf *b, size_t *at, char *tag, const char **data, size_t *len)
{
    const unsigned char *head = (const unsigned char *)b->data + *at;
    if (b->len - *at < 5)
        return -1;
    *len = (size_t)head[1] << 24 | (size_t)head[2] << 16 | (size_t)head[3] << 8 | head[4];
    if (b->len - *at - 5 < *len)
        return -1;
    *tag = (char)head[0];
    *data = b->data + *at + 5;
    *at += 5 + *len;
    return 0;
}

/* 0 when `b` is a whole, well-formed answer that does not say "fall back". */
static int parse_answer(const struct buf *b, struct answer *a)
{
    size_t at = 0, cap = 16;
    memset(a, 0, sizeof *a);
    a->argv = malloc(cap * sizeof *a->argv);
    if (a->argv == NULL)
        return -1;
    a->argv[a->argc++] = "sbatch";
    a->index = -1;
    for (;;) {
        size_t len;
        const char *data;
        char tag;
        if (next_record(b, &at, &tag, &data, &len))
            return -1;
        switch (tag) {
        case 'z':
            a->argv[a->argc] = NULL;
            if (a->has_script && (a->index < 0 || a->index + 1 >= a->argc || a->name == NULL))
                return -1;
            return 0;
        case 'x':
            return -1;
        case 'w':
            a->warning = data;
            a->warning_len = len;
            break;
        case 'a':
            if ((size_t)a->argc + 2 > cap) {
                char **grown = realloc(a->argv, (cap *= 2) * sizeof *a->argv);
                if (grown == NULL)
                    return -1;
                a->argv = grown;
            }
            if ((a->argv[a->argc++] = word(data, len)) == NULL)
                return -1;
            break;
        case 'i':
            a->in = data;
            a->in_len = len;
            a->has_in = 1;
            break;
        case 'n': {
            char *text = word(data, len), *end;
            a->index = text ? strtol(text, &end, 10) : -1;
            if (text == NULL || *text == '\0' || *end != '\0')
                a->index = -1;
            free(text);
            break;
        }
        case 'f':
            a->name = word(data, len);
            if (a->name == NULL || strchr(a->name, '/') || strcmp(a->name, ".") == 0 ||
                strcmp(a->name, "..") == 0 || *a->name == '\0')
                return -1;
            break;
        case 's':
            a->script = data;
            a->script_len = len;
            a->has_script = 1;
            break;
        default:
            return -1;
        }
    }
}

/* The key of a request: protocol, argv and the script text as read (the records the
 * helper's answer depends on besides the environment). */
static int build_key(struct buf *key, int argc, char **argv, const char *text, size_t text_len)
{
    int i;
    if (put_record(key, 'v', PSB_HELPER_PROTOCOL, strlen(PSB_HELPER_PROTOCOL)))
        return -1;
    for (i = 1; i < argc; i++)
        if (put_record(key, 'a', argv[i], strlen(argv[i])))
            return -1;
    return text ? put_record(key, 't', text, text_len) : 0;
}

/* 64-bit FNV-1a: the name of a request's entry in the helper's memo. */
static unsigned long long key_hash(const struct buf *key)
{
    unsigned long long h = 14695981039346656037ULL;
    size_t i;
    for (i = 0; i < key->len; i++) {
        h ^= (unsigned char)key->data[i];
        h *= 1099511628211ULL;
    }
    return h;
}

/* The request: the key, the memo name, then the environment as one record, each
 * NAME=value ended by a NUL: the helper reads only the variables it needs from it. */
static int build_request(struct buf *req, const struct buf *key, const char *name)
{
    extern char **environ;
    char **e;
    size_t env_len = 0;
    if (buf_add(req, key->data, key->len) || put_record(req, 'h', name, strlen(name)))
        return -1;
    for (e = environ; e && *e; e++)
        env_len += strlen(*e) + 1;
    if (put_head(req, 'E', env_len))
        return -1;
    for (e = environ; e && *e; e++)
        if (buf_add(req, *e, strlen(*e) + 1))
            return -1;
    return put_record(req, 'z', "", 0);
}

/* Whether a helper holds its lock in `dir` (it then keeps its memo current: it empties
 * the memo when it starts and when it exits, also on a code change). A memo hit marks
 * the lock file, so the helper does not exit idle while its memo serves. */
static int helper_alive(const char *dir)
{
    char path[PATH_MAX];
    int fd, alive = 0;
    if (snprintf(path, sizeof path, "%s/%s", dir, PSB_HELPER_LOCK) >= (int)sizeof path)
        return 0;
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return 0;
    if (flock(fd, LOCK_SH | LOCK_NB) != 0)
        alive = errno == EWOULDBLOCK;
    else
        flock(fd, LOCK_UN);
    if (alive)
        futimens(fd, NULL);
    close(fd);
    return alive;
}

/* The answer kept in the memo entry `entry` for this very request: the entry holds the key
 * (compared whole), the variables the answer read (NAME, then its value or its absence,
 * compared with getenv) and the answer. 0 with `a` filled when it applies. */
static int memo_match(const struct buf *entry, const struct buf *key, struct answer *a)
{
    size_t at = 0, len;
    const char *data;
    char tag;
    struct buf rest;
    if (next_record(entry, &at, &tag, &data, &len) || tag != 'k' || len != key->len ||
        memcmp(data, key->data, len) != 0)
        return -1;
    for (;;) {
        size_t mark = at, value_len;
        const char *value, *have;
        char *var;
        if (next_record(entry, &at, &tag, &data, &len))
            return -1;
        if (tag != 'g') {
            at = mark;
            break;
        }
        if (next_record(entry, &at, &tag, &value, &value_len) || (tag != 'G' && tag != 'N') ||
            (var = word(data, len)) == NULL)
            return -1;
        have = getenv(var);
        free(var);
        if (tag == 'N' ? have != NULL : (have == NULL || strlen(have) != value_len || memcmp(have, value, value_len)))
            return -1;
    }
    rest.data = entry->data + at;
    rest.len = rest.cap = entry->len - at;
    return parse_answer(&rest, a);
}

/* The helper's answer to this very request, from its memo entry named `name` (0 with `a`
 * filled on a hit). A hit marks the entry used: the helper drops the least recently used
 * entries first, so a sweep of new scripts does not push out the one resubmitted daily. */
static int memo_answer(const char *dir, const char *name, const struct buf *key, struct buf *entry,
                       struct answer *a)
{
    char path[PATH_MAX];
    struct stat st;
    int fd, hit;
    if (snprintf(path, sizeof path, "%s/%s/%s", dir, PSB_HELPER_MEMO, name) >= (int)sizeof path)
        return -1;
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -1;
    hit = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == getuid() &&
          read_all(fd, entry, PSB_HELPER_MAX_ANSWER_BYTES) == 0 && entry->len <= PSB_HELPER_MAX_ANSWER_BYTES &&
          memo_match(entry, key, a) == 0;
    if (hit)
        futimens(fd, NULL);
    close(fd);
    return hit ? 0 : -1;
}

/* Write the rewritten script to a fresh folder inside the helper's own (private, checked)
 * folder, named after this process, and point sbatch's argv at it: sbatch keeps this pid
 * when it is exec'd, and the helper removes the folder once it has ended. -1 when it
 * could not be written (nothing is left behind). */
static int write_script(struct answer *a, const char *helper)
{
    char dir[PATH_MAX], path[PATH_MAX];
    int fd, written;
    if (snprintf(dir, sizeof dir, "%s/%s%ld-XXXXXX", helper, PSB_HELPER_JOB_PREFIX, (long)getpid()) >=
            (int)sizeof dir || mkdtemp(dir) == NULL)
        return -1;
    if (snprintf(path, sizeof path, "%s/%s", dir, a->name) >= (int)sizeof path) {
        rmdir(dir);
        return -1;
    }
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    written = fd >= 0 && write_all(fd, a->script, a->script_len) == 0;
    if (fd >= 0 && close(fd) != 0)
        written = 0;
    if (!written) {
        unlink(path);
        rmdir(dir);
        return -1;
    }
    a->argv[a->index + 1] = strdup(path);
    return a->argv[a->index + 1] ? 0 : -1;
}

/* Carry out the helper's answer: never returns, unless the rewritten script cannot be
 * handed to sbatch (HELPER_UNUSABLE: nothing was submitted). */
static int carry_out(struct answer *a, const char *dir, const char *sbatch)
{
    if (a->has_script && write_script(a, dir) != 0)
        return HELPER_UNUSABLE;
    if (a->has_in) {
        struct buf in = {(char *)a->in, a->in_len, a->in_len};
        if (restore_stdin(&in) != 0)
            return HELPER_UNUSABLE;
    }
    if (a->warning_len)
        write_all(2, a->warning, a->warning_len);
    exec_sbatch(sbatch, a->argv);
    return HELPER_UNUSABLE; /* not reached */
}

/* Carry out the helper's answer, from its memo when the same request (same key and the
 * same values of the variables the answer read) was answered before, else asked over its
 * socket. Returns 0 when the helper answered "fall back", HELPER_ABSENT when none runs,
 * HELPER_UNUSABLE otherwise. */
static int ask_helper(const char *dir, int argc, char **argv, const char *sbatch, const char *text,
                      size_t text_len)
{
    struct buf key = {NULL, 0, 0}, req = {NULL, 0, 0}, ans = {NULL, 0, 0};
    struct answer a;
    char name[17];
    int fd, why = private_dir(dir);
    if (why)
        return why;
    if (build_key(&key, argc, argv, text, text_len) != 0)
        return HELPER_UNUSABLE;
    snprintf(name, sizeof name, "%016llx", key_hash(&key));
    if (helper_alive(dir) && memo_answer(dir, name, &key, &ans, &a) == 0)
        return carry_out(&a, dir, sbatch);
    ans.len = 0;
    fd = helper_connect(dir);
    if (fd < 0)
        return -fd;
    if (build_request(&req, &key, name) != 0 || write_all(fd, req.data, req.len) != 0) {
        close(fd);
        return HELPER_UNUSABLE;
    }
    await_answer(fd, HELPER_SPIN_US);
    if (read_all(fd, &ans, PSB_HELPER_MAX_ANSWER_BYTES) != 0 || ans.len > PSB_HELPER_MAX_ANSWER_BYTES) {
        close(fd);
        return HELPER_UNUSABLE;
    }
    close(fd);
    free(req.data);
    free(key.data);
    if (parse_answer(&ans, &a) != 0)
        return 0;
    return carry_out(&a, dir, sbatch);
}

/* Carry out the decision made here (decide.c), when it could be made: returns only when
 * it could not (nothing was submitted). A rewritten script file goes where the helper's
 * answers put it, in a folder of the helper's own folder, which a helper removes once
 * sbatch has ended: so a helper is started when none runs (never from inside a job). */
static void decide_here(int argc, char **argv, const char *sbatch, const char *text, size_t text_len,
                        const char *dir)
{
    struct answer a;
    int alive = dir && private_dir(dir) == 0 && helper_alive(dir);
    int may_start = dir && getenv("SLURM_JOB_ID") == NULL;
    if (!switched_on("PIPESWIFT_PSBATCH_FAST", 1) || psb_decide(argc, argv, text, text_len, alive || may_start, &a))
        return;
    if (a.has_script && !alive) {
        start_helper(dir);
        if (private_dir(dir) != 0)
            return;
    }
    carry_out(&a, dir, sbatch);
}

/* A job psbatch enriches: decided here, else the helper's answer, else the Python psbatch. */
static void hand_off(int argc, char **argv, const char *sbatch, const struct scan *s, const char *text,
                     size_t text_len)
{
    char dir[PATH_MAX];
    int helper = helper_enabled() && helper_dir(dir, sizeof dir);
    decide_here(argc, argv, sbatch, text, text_len, helper ? dir : NULL);
    if (helper) {
        int why = ask_helper(dir, argc, argv, sbatch, text, text_len);
        if (why == HELPER_ABSENT && getenv("SLURM_JOB_ID") == NULL) /* none left behind in jobs */
            start_helper(dir);
    }
    exec_python(argc, argv, sbatch, s);
}

int main(int argc, char **argv)
{
    static char *no_args[] = {"psbatch", NULL};
    struct self me;
    struct scan s;
    struct buf in = {NULL, 0, 0};
    const char *text = NULL;
    size_t text_len = 0;
    int consumed = 0, own = 0, i;
    char *sbatch;

    if (argc < 1 || argv[0] == NULL) { /* exec'd with no argv at all */
        argc = 1;
        argv = no_args;
    }
    memset(&me, 0, sizeof me);
    me.argv0 = argv[0];
    memset(&s, 0, sizeof s);
    s.script_index = -1;
    s.own = calloc((size_t)argc + 1, 1);
    if (s.own == NULL) {
        fputs("psbatch: error: out of memory\n", stderr);
        return 1;
    }
    scan_argv(argc, argv, &s);
    for (i = 1; i < argc; i++)
        own |= s.own[i]; /* psbatch's own options (where strip_own_options finds them) */

    if (s.has_wrap) {
        text = s.wrap ? s.wrap : "";
        text_len = strlen(text);
    } else if (s.script_index >= 0) {
        int fd = open(argv[s.script_index], O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            if (read_all(fd, &in, PSB_MAX_SCRIPT_BYTES) == 0 && in.len <= PSB_MAX_SCRIPT_BYTES) {
                text = in.data ? in.data : "";
                text_len = in.len;
            }
            close(fd);
        } /* unreadable: sbatch reports it */
    } else if (!s.unknown && !s.no_stdin && fcntl(0, F_GETFD) != -1 && !isatty(0)) {
        int rc = read_all(0, &in, 0);
        consumed = 1;
        if (rc != 0) { /* Python's read fails too: it warns and submits unchanged */
            if (in.len)
                restore_stdin(&in);
            exec_python(argc, argv, sbatch_or_exit(&me), &s);
        }
        if (in.len <= PSB_MAX_SCRIPT_BYTES) {
            text = in.data ? in.data : "";
            text_len = in.len;
        }
    }

    sbatch = sbatch_or_exit(&me);
    if (consumed && restore_stdin(&in) != 0) {
        fprintf(stderr, "psbatch: error: cannot hand the script read from stdin to sbatch: %s\n", strerror(errno));
        return 1;
    }
    if (own || (text && has_marker(text, text_len)))
        hand_off(argc, argv, sbatch, &s, text, text_len);
    exec_sbatch(sbatch, argv);
    return 126;
}
