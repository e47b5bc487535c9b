/* Standalone replay driver for builds without libFuzzer (systemd's
 * src/fuzz/fuzz-main.c idea): `fuzz-<target> PATH...` runs every file named,
 * and every non-hidden file in every directory named (sorted), through
 * LLVMFuzzerTestOneInput once, and prints TAP. A missing path is a skip, so a
 * target without regressions yet still passes.
 *
 * A target that finds a bug abort()s or trips a sanitizer: the process dies
 * and the test fails, with the file named on the line before. Each input is
 * copied into a heap buffer of exactly its size, so an over-read is caught by
 * ASan here as it is under libFuzzer. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static unsigned n_test;

static int read_file(const char *path, uint8_t **out, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    uint8_t *p;
    size_t got = 0;

    if (fd < 0)
        return -errno;
    if (fstat(fd, &st) < 0) {
        int err = errno;
        close(fd);
        return -err;
    }
    /* malloc(0) may return NULL; keep a real pointer for empty inputs. */
    p = malloc(st.st_size ? (size_t)st.st_size : 1);
    if (!p) {
        close(fd);
        return -ENOMEM;
    }
    while (got < (size_t)st.st_size) {
        ssize_t r = read(fd, p + got, (size_t)st.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int err = r < 0 ? errno : EIO;
            free(p);
            close(fd);
            return -err;
        }
        got += (size_t)r;
    }
    close(fd);
    *out = p;
    *len = got;
    return 0;
}

static int run_file(const char *path)
{
    uint8_t *data = NULL;
    size_t len = 0;
    int r = read_file(path, &data, &len);

    n_test++;
    if (r < 0) {
        printf("not ok %u - %s: %s\n", n_test, path, strerror(-r));
        return 1;
    }
    /* The name first: if the target crashes, the log says on what. */
    fprintf(stderr, "# %s (%zu bytes)\n", path, len);
    LLVMFuzzerTestOneInput(data, len);
    free(data);
    printf("ok %u - %s\n", n_test, path);
    fflush(stdout);
    return 0;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_dir(const char *path)
{
    DIR *d = opendir(path);
    struct dirent *de;
    char **names = NULL;
    size_t n = 0, cap = 0;
    int failed = 0;

    if (!d) {
        n_test++;
        printf("not ok %u - %s: %s\n", n_test, path, strerror(errno));
        return 1;
    }
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            names = realloc(names, cap * sizeof(*names));
            if (!names)
                abort();
        }
        if (asprintf(&names[n++], "%s/%s", path, de->d_name) < 0)
            abort();
    }
    closedir(d);
    qsort(names, n, sizeof(*names), cmp_names);
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        if (stat(names[i], &st) == 0 && S_ISREG(st.st_mode))
            failed |= run_file(names[i]);
        free(names[i]);
    }
    free(names);
    return failed;
}

int main(int argc, char **argv)
{
    int failed = 0;

    if (LLVMFuzzerInitialize)
        LLVMFuzzerInitialize(&argc, &argv);
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        struct stat st;

        if (stat(argv[i], &st) < 0) {
            n_test++;
            printf("ok %u - %s # SKIP %s\n", n_test, argv[i], strerror(errno));
        } else if (S_ISDIR(st.st_mode)) {
            failed |= run_dir(argv[i]);
        } else {
            failed |= run_file(argv[i]);
        }
    }
    printf("1..%u\n", n_test);
    return failed;
}
