/* file.c: see file.h. */
#include "core/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* What a non-regular file is, for "PATH: is X, not a regular file". */
static const char *file_kind(mode_t m)
{
    if (S_ISFIFO(m))
        return "a FIFO (named pipe)";
    if (S_ISDIR(m))
        return "a directory";
    if (S_ISCHR(m))
        return "a character device";
    if (S_ISBLK(m))
        return "a block device";
    if (S_ISSOCK(m))
        return "a socket";
    return "not a regular file";
}

static dflash_status not_regular(const char *path, mode_t m)
{
    const char *kind = file_kind(m);
    if (!strncmp(kind, "not ", 4))
        return dflash_fail(DFLASH_ERR_IO, "%s: %s", path, kind);
    return dflash_fail(DFLASH_ERR_IO, "%s: is %s, not a regular file", path, kind);
}

/* errno of a failed read, in words; a closed stream (the CLI leaves a
 * write-only /dev/null in a closed stdin's place) is called what it is. */
static dflash_status read_failed(const char *label, int err)
{
    if (err == EBADF)
        return dflash_fail(DFLASH_ERR_IO, "%s: cannot be read: it is closed (or not open for reading)", label);
    return dflash_fail(DFLASH_ERR_IO, "%s: read error: %s", label, err ? strerror(err) : "unknown error");
}

static dflash_status too_long(const char *label, size_t max_bytes, const char *what)
{
    return dflash_fail(DFLASH_ERR_INVALID_ARG, "%s: more than %zu bytes (the limit for %s)", label, max_bytes, what);
}

/* Room for at least one more byte and the NUL; never more than max + 2
 * bytes, so reading stops one byte past the limit. */
static dflash_status grow(char **p, size_t *cap, size_t n, size_t max_bytes, const char *label)
{
    if (*cap - n >= 2)
        return DFLASH_OK;
    size_t want = *cap ? *cap * 2 : 4096;
    if (want > max_bytes + 2)
        want = max_bytes + 2;
    char *q = realloc(*p, want);
    if (!q)
        return dflash_fail(DFLASH_ERR_OOM, "%s: out of memory for %zu bytes", label, want);
    *p = q;
    *cap = want;
    return DFLASH_OK;
}

/* One step: a chunk (whole-stream mode) or one byte (delimiter mode).
 * *stop: the read is complete (EOF or delimiter). */
static dflash_status read_step(FILE *f, const char *label, int delim, char *p, size_t cap, size_t *n, int *stop,
                               int *at_eof)
{
    if (delim < 0) {
        size_t room = cap - *n - 1;
        size_t got = fread(p + *n, 1, room, f);
        *n += got;
        if (got == room)
            return DFLASH_OK;
    } else {
        int c = getc(f);
        if (c != EOF) {
            if (c == delim)
                *stop = 1;
            else
                p[(*n)++] = (char)c;
            return DFLASH_OK;
        }
    }
    if (ferror(f))
        return read_failed(label, errno);
    *stop = *at_eof = 1;
    return DFLASH_OK;
}

dflash_status dflash_read_bounded(FILE *f, const char *label, size_t max_bytes, const char *what, int delim,
                                  char **data, size_t *len, int *at_eof)
{
    *data = NULL;
    *len = 0;
    if (max_bytes > SIZE_MAX / 2)
        max_bytes = SIZE_MAX / 2;
    char *p = NULL;
    size_t cap = 0, n = 0;
    int stop = 0, eof = 0;
    dflash_status s = DFLASH_OK;
    errno = 0;
    while (s == DFLASH_OK && !stop) {
        if (n > max_bytes)
            s = too_long(label, max_bytes, what);
        else if ((s = grow(&p, &cap, n, max_bytes, label)) == DFLASH_OK)
            s = read_step(f, label, delim, p, cap, &n, &stop, &eof);
    }
    if (s == DFLASH_OK && n > max_bytes)
        s = too_long(label, max_bytes, what);
    if (s != DFLASH_OK) {
        free(p);
        return s;
    }
    p[n] = 0;
    *data = p;
    *len = n;
    if (at_eof)
        *at_eof = eof;
    return DFLASH_OK;
}

dflash_status dflash_read_stream(FILE *f, const char *label, char **data, size_t *len)
{
    return dflash_read_bounded(f, label, DFLASH_STREAM_MAX_BYTES, "a stream read into memory", -1, data, len, NULL);
}

dflash_status dflash_open_regular(const char *path, int *fd_out, uint64_t *size)
{
    *fd_out = -1;
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a
     * writer; fstat then says what the path is before anything is read. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return dflash_fail(errno == ENOENT ? DFLASH_ERR_NOT_FOUND : DFLASH_ERR_IO, "%s: cannot open: %s", path,
                           strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return dflash_fail(DFLASH_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return not_regular(path, sb.st_mode);
    }
    /* A regular file ignores O_NONBLOCK, but reads are plain blocking reads. */
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
        int e = errno;
        close(fd);
        return dflash_fail(DFLASH_ERR_IO, "%s: cannot open: %s", path, strerror(e));
    }
    *fd_out = fd;
    *size = (uint64_t)sb.st_size;
    return DFLASH_OK;
}

dflash_status dflash_read_file(const char *path, size_t max_bytes, char **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    int fd;
    uint64_t size;
    DFLASH_TRY(dflash_open_regular(path, &fd, &size));
    if (size > max_bytes) {
        close(fd);
        return dflash_fail(DFLASH_ERR_IO, "%s: %llu bytes, more than the limit of %zu for this file", path,
                           (unsigned long long)size, max_bytes);
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        return dflash_fail(DFLASH_ERR_IO, "%s: cannot open: %s", path, strerror(e));
    }
    /* The bound holds even if the file grows after fstat. */
    dflash_status s = dflash_read_bounded(f, path, max_bytes, "this file", -1, data, len, NULL);
    fclose(f);
    return s;
}
