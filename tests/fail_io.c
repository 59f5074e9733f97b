/* Preloaded by test_io_faults.py (LD_PRELOAD): one transient I/O error, as a disk or a
 * network file system gives, at a chosen call on a chosen file. Counts the calls of kind
 * GPTC_FAIL_OP ("write": write and pwrite; "read": read and pread) on descriptors whose
 * path holds GPTC_FAIL_PATH, and fails call number GPTC_FAIL_AT (1-based) with EIO, once;
 * the calls after it succeed. At exit it says on stderr how many such calls it saw and
 * whether it failed one, so that the test knows the range to try and that a run which
 * ended well had no failed call. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static atomic_long g_calls; /* calls of the kind on the file so far */
static atomic_int g_failed; /* the chosen one was failed */

/* 1 when a call of kind op on fd is one to count */
static int watched(const char *op, int fd) {
    const char *want = getenv("GPTC_FAIL_PATH"), *kind = getenv("GPTC_FAIL_OP");
    if (!want || !*want || !kind || strcmp(kind, op) != 0) return 0;
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n < 0) return 0;
    path[n] = '\0';
    return strstr(path, want) != NULL;
}

/* 1 when this call is the one to fail (errno set) */
static int fail_this(const char *op, int fd) {
    if (!watched(op, fd)) return 0;
    long call = atomic_fetch_add(&g_calls, 1) + 1;
    const char *at = getenv("GPTC_FAIL_AT");
    if (!at || atol(at) != call) return 0;
    atomic_store(&g_failed, 1);
    errno = EIO;
    return 1;
}

static void *real(const char *name) { return dlsym(RTLD_NEXT, name); }

ssize_t write(int fd, const void *buf, size_t n) {
    static ssize_t (*next)(int, const void *, size_t);
    if (!next) next = (ssize_t(*)(int, const void *, size_t))real("write");
    return fail_this("write", fd) ? -1 : next(fd, buf, n);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t at) {
    static ssize_t (*next)(int, const void *, size_t, off_t);
    if (!next) next = (ssize_t(*)(int, const void *, size_t, off_t))real("pwrite");
    return fail_this("write", fd) ? -1 : next(fd, buf, n, at);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t at) { return pwrite(fd, buf, n, at); }

ssize_t read(int fd, void *buf, size_t n) {
    static ssize_t (*next)(int, void *, size_t);
    if (!next) next = (ssize_t(*)(int, void *, size_t))real("read");
    return fail_this("read", fd) ? -1 : next(fd, buf, n);
}

ssize_t pread(int fd, void *buf, size_t n, off_t at) {
    static ssize_t (*next)(int, void *, size_t, off_t);
    if (!next) next = (ssize_t(*)(int, void *, size_t, off_t))real("pread");
    return fail_this("read", fd) ? -1 : next(fd, buf, n, at);
}

ssize_t pread64(int fd, void *buf, size_t n, off_t at) { return pread(fd, buf, n, at); }

__attribute__((destructor)) static void say_count(void) {
    if (!getenv("GPTC_FAIL_PATH")) return;
    char line[128];
    int len = snprintf(line, sizeof line, "fail_io: pid %ld: %ld calls, failed %d\n",
                       (long)getpid(), atomic_load(&g_calls), atomic_load(&g_failed));
    ssize_t (*next)(int, const void *, size_t) = (ssize_t(*)(int, const void *, size_t))real("write");
    if (next && len > 0) next(2, line, (size_t)len);
}
