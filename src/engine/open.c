/* open.c: the backend and proposer opened by name (see open.h). */
#include "engine/open.h"

#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "core/log.h"
#include "core/status.h"
#include "draft/dflash_head.h"
#include "draft/ngram.h"
#include "io/chat.h"
#include "io/hf_config.h"
#include "spec/spec.h"

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

dflash_status dflash_open_block(const char *draft, int block_size, int *block, int *own)
{
    *block = 1;
    *own = 0;
    if (!draft)
        return DFLASH_OK;
    int b = block_size > 0 ? block_size : 16; /* ngram: dflash_open_proposer's block */
    if (strcmp(draft, "ngram") != 0) {
        dflash_model_config dc;
        DFLASH_TRY(dflash_config_load(draft, &dc));
        *own = dc.is_dflash ? dc.block_size : DFLASH_MAX_BLOCK;
        b = block_size > 0 && block_size < *own ? block_size : *own;
    }
    *block = b < 1 ? 1 : b > DFLASH_MAX_BLOCK ? DFLASH_MAX_BLOCK : b;
    return DFLASH_OK;
}

int dflash_open_target_rows(int n_seqs, int block)
{
    const int64_t rows = (int64_t)(n_seqs > 0 ? n_seqs : 1) * (block > 0 ? block : 1);
    return rows < 64 ? 64 : rows > 512 ? 512 : (int)rows;
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

void dflash_stop_ids_add(int32_t *ids, int cap, int *n, int32_t id)
{
    for (int i = 0; i < *n; i++)
        if (ids[i] == id)
            return;
    if (id >= 0 && *n < cap)
        ids[(*n)++] = id;
}

dflash_status dflash_open_stop_ids(const dflash_qwen3 *target, const char *model_dir, const dflash_tokenizer *tok,
                                   int32_t *ids, int cap, int *n)
{
    for (int i = 0; i < target->cfg.n_eos; i++)
        dflash_stop_ids_add(ids, cap, n, target->cfg.eos_token_ids[i]);
    if (!tok)
        return DFLASH_OK;
    int32_t found[DFLASH_CHAT_MAX_EOS];
    size_t nf = 0;
    DFLASH_TRY(dflash_chat_eos_ids(model_dir, tok, found, DFLASH_CHAT_MAX_EOS, &nf));
    for (size_t i = 0; i < nf; i++)
        dflash_stop_ids_add(ids, cap, n, found[i]);
    return DFLASH_OK;
}
