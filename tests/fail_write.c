/* Preloaded by test_save_faults.py (LD_PRELOAD): one transient I/O error, as a disk or a
 * network file system gives, at a chosen write of a chosen file. Counts the write() and
 * pwrite() calls on descriptors whose path holds GPTC_FAIL_WRITE_PATH and fails call
 * number GPTC_FAIL_WRITE_AT (1-based) with EIO, once; the calls after it succeed. At exit
 * it says on stderr how many such calls it saw and whether it failed one, so that the
 * test knows the range to try and that a run which ended well had no failed write. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static atomic_long g_calls;  /* writes to the file so far */
static atomic_int g_failed;  /* the chosen one was failed */

/* 1 when fd's path holds GPTC_FAIL_WRITE_PATH */
static int watched(int fd) {
    const char *want = getenv("GPTC_FAIL_WRITE_PATH");
    if (!want || !*want) return 0;
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n < 0) return 0;
    path[n] = '\0';
    return strstr(path, want) != NULL;
}

/* 1 when this write is the one to fail (errno set) */
static int fail_this(int fd) {
    if (!watched(fd)) return 0;
    long call = atomic_fetch_add(&g_calls, 1) + 1;
    const char *at = getenv("GPTC_FAIL_WRITE_AT");
    if (!at || atol(at) != call) return 0;
    atomic_store(&g_failed, 1);
    errno = EIO;
    return 1;
}

ssize_t write(int fd, const void *buf, size_t n) {
    static ssize_t (*real)(int, const void *, size_t);
    if (!real) real = (ssize_t(*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    if (fail_this(fd)) return -1;
    return real(fd, buf, n);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t at) {
    static ssize_t (*real)(int, const void *, size_t, off_t);
    if (!real) real = (ssize_t(*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, "pwrite");
    if (fail_this(fd)) return -1;
    return real(fd, buf, n, at);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t at) { return pwrite(fd, buf, n, at); }

__attribute__((destructor)) static void say_count(void) {
    if (!getenv("GPTC_FAIL_WRITE_PATH")) return;
    char line[128];
    int len = snprintf(line, sizeof line, "fail_write: pid %ld: %ld writes, failed %d\n",
                       (long)getpid(), atomic_load(&g_calls), atomic_load(&g_failed));
    ssize_t (*real)(int, const void *, size_t) =
        (ssize_t(*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    if (real && len > 0) real(2, line, (size_t)len);
}
