/* chat.h: the chat formats (what a model's chat_template renders for plain
 * system/user/assistant turns), which one a model uses, and the model's
 * end-of-sequence ids.
 *
 * Qwen3:
 *   [<|im_start|>system\n{system}<|im_end|>\n]
 *   <|im_start|>user\n{user}<|im_end|>\n
 *   <|im_start|>assistant\n{earlier answer}<|im_end|>\n      (multi-turn)
 *   ...
 *   <|im_start|>assistant\n[<think>\n\n</think>\n\n]          (generation prompt)
 *
 * The empty think block is Qwen3's enable_thinking=False; it is the default
 * here, and opts.thinking = 1 leaves it out so the model may think. Earlier
 * assistant turns are rendered as the template renders turns before the
 * last user message: any "...</think>" reasoning prefix is dropped.
 *
 * Llama 3 (the template of Meta-Llama-3-*-Instruct, also shipped with
 * Llama 3.1 tokenizers outside Meta's own repositories):
 *   <|begin_of_text|>                                        (first message only)
 *   <|start_header_id|>{role}<|end_header_id|>\n\n{content, trimmed}<|eot_id|>
 *   ...
 *   <|start_header_id|>assistant<|end_header_id|>\n\n        (generation prompt)
 *
 * "Trimmed" is Jinja's trim: Python's str.strip(), every Unicode white
 * space character at both ends. Thinking does not apply. Meta's Llama 3.1+
 * templates add a system block with a knowledge cutoff and today's date and
 * tool calling; they are recognised and refused (dflash_chat_format_detect).
 * Tools and tool responses are not supported in either format. */
#ifndef DFLASH_IO_CHAT_H
#define DFLASH_IO_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "dflash.h"
#include "io/tokenizer.h"

typedef enum dflash_chat_role {
    DFLASH_CHAT_SYSTEM = 0,
    DFLASH_CHAT_USER = 1,
    DFLASH_CHAT_ASSISTANT = 2,
} dflash_chat_role;

typedef struct dflash_chat_msg {
    dflash_chat_role role;
    const char *content; /* UTF-8, NUL-terminated */
} dflash_chat_msg;

typedef enum dflash_chat_format {
    DFLASH_CHAT_QWEN3 = 0,
    DFLASH_CHAT_LLAMA3 = 1,
} dflash_chat_format;

typedef struct dflash_chat_opts {
    dflash_chat_format format; /* DFLASH_CHAT_QWEN3 (default) */
    int thinking;              /* Qwen3: 0 (default) appends the empty think block */
    int add_generation_prompt; /* 1 (default): end with the assistant prefix */
    /* 1: the messages continue an earlier rendering (a later chat turn):
     * Llama 3's <|begin_of_text|> is not written again. */
    int continuing;
} dflash_chat_opts;

dflash_chat_opts dflash_chat_default_opts(void);

/* The marker that ends a turn ("<|im_end|>", "<|eot_id|>") and what the
 * format writes between a turn's end and the next turn ("\n", ""). */
const char *dflash_chat_end_of_turn(dflash_chat_format f);
const char *dflash_chat_turn_separator(dflash_chat_format f);

/* The format of the model whose tokenizer files are in dir (tok loaded from
 * there): tokenizer_config.json's chat_template when it has one (Qwen3's
 * markup or Llama 3's; a Llama 3.1+ template with its date preamble, or a
 * template of neither markup, is DFLASH_ERR_UNSUPPORTED naming the file);
 * without a template, Llama 3 when tok has <|start_header_id|> as an added
 * token, else Qwen3. */
dflash_status dflash_chat_format_detect(const char *dir, const dflash_tokenizer *tok, dflash_chat_format *fmt);

/* Render msgs[0..n) to text; *text is malloc'd, NUL-terminated. opts may be
 * NULL for the defaults. */
dflash_status dflash_chat_render(const dflash_chat_msg *msgs, size_t n,
                                 const dflash_chat_opts *opts, char **text, size_t *len);
/* Check that tok has, as single added tokens, the markup that rendering
 * with opts writes: Qwen3's <|im_start|> and <|im_end|>, and <think> and
 * </think> when the empty think block is rendered; Llama 3's
 * <|begin_of_text|>, <|start_header_id|>, <|end_header_id|>, <|eot_id|>. Otherwise DFLASH_ERR_UNSUPPORTED
 * naming the missing token and the tokenizer file: such a tokenizer would
 * encode the markup as plain text, and could never stop at the end of a
 * turn. opts may be NULL for the defaults. */
dflash_status dflash_chat_check_tokenizer(dflash_tokenizer *tok, const dflash_chat_opts *opts);
/* Render and encode (special tokens in the rendered text become their ids,
 * as with HF apply_chat_template(tokenize=True)). Like transformers it does
 * not refuse a tokenizer without the markup (a base model can still be
 * given a chat-shaped prompt); callers that want the warning run
 * dflash_chat_check_tokenizer first. *ids is malloc'd. */
dflash_status dflash_chat_encode(dflash_tokenizer *tok, const dflash_chat_msg *msgs, size_t n,
                                 const dflash_chat_opts *opts, int32_t **ids, size_t *n_ids);

#define DFLASH_CHAT_MAX_EOS 8
/* End-of-sequence ids of the model in model_dir, without duplicates:
 * tokenizer_config.json's eos_token (looked up in tok), then
 * generation_config.json's eos_token_id (an int or a list), or, when that
 * file is absent or names none, config.json's eos_token_id (HF generation's
 * fallback). Any file may be missing; DFLASH_ERR_NOT_FOUND, naming the
 * files looked at, only when none names an id. ids has room for cap
 * entries. */
dflash_status dflash_chat_eos_ids(const char *model_dir, const dflash_tokenizer *tok,
                                  int32_t *ids, size_t cap, size_t *n);

#endif
