/* open.c: the backend and proposer opened by name (see open.h). */
#include "engine/open.h"

#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "core/log.h"
#include "core/status.h"
#include "draft/dflash_head.h"
#include "draft/ngram.h"

dflash_status dflash_open_backend(const char *device, const char *label, dflash_backend **out)
{
    if (device && strcmp(device, "cpu") != 0) {
        dflash_status s = dflash_backend_cuda_create(0, out);
        if (s == DFLASH_OK) {
            dflash_log(DFLASH_LOG_INFO, "device: %s", dflash_cuda_device_desc(*out));
            return DFLASH_OK;
        }
        if (!strcmp(device, "cuda"))
            return dflash_fail_prefix(s, "%s", label);
        dflash_log(DFLASH_LOG_INFO, "device: cpu (no usable GPU: %s)", dflash_last_error());
    }
    return dflash_backend_cpu_create(out);
}

dflash_status dflash_open_proposer(const char *draft, dflash_qwen3 *target, int block_size, int ctx_cap, int quant,
                                   dflash_proposer **out)
{
    if (!strcmp(draft, "ngram"))
        return dflash_ngram_create(block_size ? block_size : 16, 1, 3, out);
    dflash_head_opts ho;
    dflash_head_default_opts(&ho);
    ho.max_ctx = target->opts.max_ctx;
    ho.max_seqs = target->opts.max_seqs; /* one proposer state per target sequence */
    ho.ctx_cap = ctx_cap;
    ho.block_size = block_size;
    ho.quant = quant;
    dflash_head *h;
    DFLASH_TRY(dflash_head_load(draft, target, &ho, &h));
    *out = &h->proposer;
    return DFLASH_OK;
}
