/* fuzz_file.h - the fuzz targets' input as a file the library can open.
 *
 * The public API opens paths, so each input is written to an anonymous in-memory file (memfd)
 * and opened as /proc/self/fd/N: a regular file, as the reader requires, that never touches the
 * disk. One memfd per role is made once and rewritten for every input. */
#ifndef RM_FUZZ_FILE_H
#define RM_FUZZ_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct fuzz_file {
    int  fd;
    char path[64];
} fuzz_file;

/* Replaces the file's contents with data[0..n); returns its path. Aborts on a system error,
 * which is the harness failing, not the library. */
static const char * fuzz_file_set(fuzz_file * f, const char * name, const uint8_t * data, size_t n) {
    if (f->fd <= 0) {
        f->fd = memfd_create(name, MFD_CLOEXEC);
        if (f->fd < 0) {
            perror("memfd_create");
            abort();
        }
        snprintf(f->path, sizeof(f->path), "/proc/self/fd/%d", f->fd);
    }
    if (ftruncate(f->fd, 0) != 0) {
        perror("ftruncate");
        abort();
    }
    for (size_t done = 0; done < n;) {
        const ssize_t w = pwrite(f->fd, data + done, n - done, (off_t) done);
        if (w <= 0) {
            perror("pwrite");
            abort();
        }
        done += (size_t) w;
    }
    return f->path;
}

/* RM_FUZZ_VERBOSE=1: each input's status and message on stderr, to replay a crash or a seed. */
static int fuzz_verbose(void) {
    static int verbose = -1;
    if (verbose < 0) {
        const char * v = getenv("RM_FUZZ_VERBOSE");
        verbose = v != NULL && v[0] != '\0' && v[0] != '0';
    }
    return verbose;
}

#endif
