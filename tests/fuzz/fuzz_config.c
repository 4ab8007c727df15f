/* fuzz_config.c: libFuzzer entry for the config.json parser. Any input must
 * be accepted or refused with a status, never crash or leak; an accepted
 * config must satisfy the invariants the rest of dflash relies on. */
#include <stddef.h>
#include <stdint.h>

#include "io/hf_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dflash_model_config c;
    if (dflash_config_parse((const char *)data, size, "fuzz.json", &c) != DFLASH_OK)
        return 0;
    if (c.hidden_size <= 0 || c.num_hidden_layers <= 0 || c.num_hidden_layers > DFLASH_MAX_LAYERS ||
        c.num_key_value_heads <= 0 || c.num_attention_heads % c.num_key_value_heads != 0 || c.head_dim <= 0 ||
        c.vocab_size <= 0 || c.n_eos < 0 || c.n_eos > DFLASH_MAX_EOS)
        __builtin_trap();
    for (int i = 0; i < c.n_eos; i++)
        if (c.eos_token_ids[i] < 0 || c.eos_token_ids[i] >= c.vocab_size)
            __builtin_trap();
    if (c.is_dflash) {
        if (c.n_target_layer_ids <= 0 || c.n_target_layer_ids > DFLASH_MAX_TAPS)
            __builtin_trap();
        for (int i = 0; i < c.n_target_layer_ids; i++)
            if (c.target_layer_ids[i] < 0 || c.target_layer_ids[i] >= c.num_target_layers)
                __builtin_trap();
    }
    return 0;
}
