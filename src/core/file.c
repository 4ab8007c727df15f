/* file.c: see file.h. */
#include "core/file.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

dflash_status dflash_read_stream(FILE *f, const char *label, char **data, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *p = malloc(cap);
    for (;;) {
        if (!p)
            return dflash_fail(DFLASH_ERR_OOM, "%s: out of memory", label);
        size_t got = fread(p + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0)
            break;
        if (n == cap - 1) {
            char *q = realloc(p, cap *= 2);
            if (!q)
                free(p);
            p = q;
        }
    }
    if (ferror(f)) {
        free(p);
        return dflash_fail(DFLASH_ERR_IO, "%s: read error", label);
    }
    p[n] = 0;
    *data = p;
    *len = n;
    return DFLASH_OK;
}

dflash_status dflash_read_file(const char *path, size_t max_bytes, char **data, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return dflash_fail(errno == ENOENT ? DFLASH_ERR_NOT_FOUND : DFLASH_ERR_IO, "%s: cannot open: %s", path,
                           strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > max_bytes) {
        fclose(f);
        return dflash_fail(DFLASH_ERR_IO, "%s: not a regular file of at most %zu bytes", path, max_bytes);
    }
    dflash_status s = dflash_read_stream(f, path, data, len);
    fclose(f);
    return s;
}
