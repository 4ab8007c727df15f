/* backend.c: backend-independent helpers over the ops table. */
#include "backend/backend.h"

void dflash_backend_destroy(dflash_backend *be)
{
    if (be)
        be->ops->destroy(be);
}

dflash_status dflash_be_alloc_f32(dflash_backend *be, size_t count, float **out)
{
    return be->ops->alloc(be, count * sizeof(float), (void **)out);
}

dflash_status dflash_be_alloc_i32(dflash_backend *be, size_t count, int32_t **out)
{
    return be->ops->alloc(be, count * sizeof(int32_t), (void **)out);
}
