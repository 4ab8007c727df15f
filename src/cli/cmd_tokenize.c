/* cmd_tokenize.c: `dflash tokenize` (text -> ids) and `dflash detokenize`
 * (ids -> text) over a Hugging Face tokenizer.json; a thin shell around
 * src/io/tokenizer for scripts and for checking the tokenizer by hand. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/file.h"
#include "io/tokenizer.h"

/* The help below states the limit in words. */
_Static_assert(DFLASH_STREAM_MAX_BYTES == (size_t)64 << 20, "k_tok_help states a 64 MiB stdin limit");

static const char k_tok_help[] =
    "usage: dflash tokenize --tokenizer DIR_OR_FILE [--json] [--special] TEXT\n"
    "\n"
    "Encode TEXT (or standard input when TEXT is '-') with a Hugging Face\n"
    "tokenizer.json, as encode(text, add_special_tokens=False) would: special\n"
    "tokens written in the text (\"<|im_start|>\") become their ids. Invalid\n"
    "UTF-8 is replaced by U+FFFD. Prints the ids separated by spaces on one line.\n"
    "\n"
    "  --tokenizer P  a tokenizer.json file, or a folder holding one\n"
    "  --special      add the special tokens the tokenizer's post-processor puts\n"
    "                 around a text, as add_special_tokens=True (Llama 3:\n"
    "                 <|begin_of_text|> first; Qwen3: none)\n"
    "  --json         print {\"ids\":[...]} instead\n"
    "  -              (as TEXT) read standard input, at most 64 MiB\n"
    "  -h, --help     this text\n"
    "\n"
    "Exit status: 0 ok, 1 the tokenizer could not be loaded or used, 2 usage error.\n";

static const char k_detok_help[] =
    "usage: dflash detokenize --tokenizer DIR_OR_FILE [--json] [--skip-special] ID...\n"
    "\n"
    "Decode token ids (separate arguments and/or comma-separated lists) back to\n"
    "text with the tokenizer's ByteLevel decoder; invalid UTF-8 in the result\n"
    "becomes U+FFFD. Prints the text followed by a newline.\n"
    "\n"
    "  --tokenizer P    a tokenizer.json file, or a folder holding one\n"
    "  --json           print {\"text\":\"...\"} (JSON-escaped) instead\n"
    "  --skip-special   leave out special tokens such as <|im_end|>\n"
    "  -h, --help       this text\n"
    "\n"
    "Exit status: 0 ok, 1 the tokenizer could not be loaded or an id is not in\n"
    "its vocabulary, 2 usage error.\n";

/* Common options and the command's own switch `flag_name` (--special,
 * --skip-special) into *flag; returns -1 to go on, else the exit code. */
static int parse_opts(int argc, char **argv, const char *help, const char **tok_path, int *json,
                      const char *flag_name, int *flag, char ***rest, int *n_rest)
{
    *rest = calloc((size_t)argc + 1, sizeof **rest);
    *n_rest = 0;
    if (!*rest)
        return 1;
    int opts_done = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (opts_done || a[0] != '-' || !strcmp(a, "-") ||
            (a[1] >= '0' && a[1] <= '9')) { /* "-" is stdin; "-5" an (invalid) id */
            (*rest)[(*n_rest)++] = argv[i];
        } else if (!strcmp(a, "--")) {
            opts_done = 1;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(help, stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            *json = 1;
        } else if (!strcmp(a, flag_name)) {
            *flag = 1;
        } else if (!strcmp(a, "--tokenizer") || !strncmp(a, "--tokenizer=", 12)) {
            if (a[11] == '=') {
                *tok_path = a + 12;
            } else if (i + 1 < argc) {
                *tok_path = argv[++i];
            } else {
                fprintf(stderr, "dflash %s: --tokenizer needs a value\n", argv[0]);
                return 2;
            }
        } else {
            fprintf(stderr, "dflash %s: unknown option '%s'\n%s", argv[0], a, help);
            return 2;
        }
    }
    if (!*tok_path) {
        fprintf(stderr, "dflash %s: --tokenizer is required\n%s", argv[0], help);
        return 2;
    }
    return -1;
}


int dflash_cmd_tokenize(int argc, char **argv)
{
    const char *tok_path = NULL;
    int json = 0, special = 0, n_rest;
    char **rest;
    int rc = parse_opts(argc, argv, k_tok_help, &tok_path, &json, "--special", &special, &rest, &n_rest);
    if (rc < 0 && n_rest != 1) {
        fprintf(stderr, "dflash tokenize: expected exactly one TEXT argument (got %d)\n%s",
                n_rest, k_tok_help);
        rc = 2;
    }
    if (rc >= 0) {
        free(rest);
        return rc == 0 ? cli_finish_stdout(0) : rc; /* 0: --help was printed */
    }
    const char *text = rest[0];
    char *owned = NULL;
    size_t len = strlen(text);
    free(rest);
    if (!strcmp(text, "-")) {
        if (dflash_read_bounded(stdin, "standard input", DFLASH_STREAM_MAX_BYTES, "a text to tokenize", -1, &owned,
                                &len, NULL) != DFLASH_OK) {
            fprintf(stderr, "dflash tokenize: %s\n", dflash_last_error());
            return 1;
        }
        text = owned;
    }
    dflash_tokenizer *tok;
    int32_t *ids = NULL;
    size_t n = 0;
    if (dflash_tokenizer_load(tok_path, &tok) ||
        ((special ? dflash_tokenizer_encode_special : dflash_tokenizer_encode)(tok, text, len, &ids, &n) &&
         (dflash_tokenizer_free(tok), 1))) {
        fprintf(stderr, "dflash tokenize: %s\n", dflash_last_error());
        free(owned);
        return 1;
    }
    fputs(json ? "{\"ids\":[" : "", stdout);
    for (size_t i = 0; i < n; i++)
        printf("%s%d", i ? (json ? "," : " ") : "", ids[i]);
    fputs(json ? "]}\n" : "\n", stdout);
    free(ids);
    free(owned);
    dflash_tokenizer_free(tok);
    return cli_finish_stdout(0);
}

/* Parse ids from args like "1,2, 3" "4" (the command line's one integer
 * syntax; negative ids parse, and decoding names them as unknown); returns
 * 0 on a malformed one. */
static int parse_ids(char **args, int n_args, int32_t **ids, size_t *n)
{
    size_t cap = 16;
    *n = 0;
    *ids = malloc(cap * sizeof **ids);
    if (!*ids)
        return 0;
    for (int a = 0; a < n_args; a++) {
        const char *s = args[a];
        while (*s) {
            if (cli_is_list_sep(*s)) {
                s++;
                continue;
            }
            const char *end;
            long v;
            if (!cli_scan_int(s, INT32_MIN, INT32_MAX, &end, &v) || (*end && !cli_is_list_sep(*end))) {
                fprintf(stderr, "dflash detokenize: '%s' is not a list of decimal token ids\n", args[a]);
                return 0;
            }
            if (*n == cap) {
                int32_t *p = realloc(*ids, (cap *= 2) * sizeof *p);
                if (!p)
                    return 0;
                *ids = p;
            }
            (*ids)[(*n)++] = (int32_t)v;
            s = end;
        }
    }
    return 1;
}

int dflash_cmd_detokenize(int argc, char **argv)
{
    const char *tok_path = NULL;
    int json = 0, skip = 0, n_rest;
    char **rest;
    int rc = parse_opts(argc, argv, k_detok_help, &tok_path, &json, "--skip-special", &skip, &rest, &n_rest);
    if (rc >= 0) {
        free(rest);
        return rc == 0 ? cli_finish_stdout(0) : rc; /* 0: --help was printed */
    }
    int32_t *ids;
    size_t n;
    if (!parse_ids(rest, n_rest, &ids, &n)) {
        free(rest);
        free(ids);
        return 2;
    }
    free(rest);
    dflash_tokenizer *tok;
    char *text = NULL;
    size_t len = 0;
    if (dflash_tokenizer_load(tok_path, &tok)) {
        fprintf(stderr, "dflash detokenize: %s\n", dflash_last_error());
        free(ids);
        return 1;
    }
    rc = 0;
    if (dflash_tokenizer_decode(tok, ids, n, skip ? DFLASH_DECODE_SKIP_SPECIAL : 0, &text, &len)) {
        fprintf(stderr, "dflash detokenize: %s\n", dflash_last_error());
        rc = 1;
    } else if (json) {
        json_t *o = json_pack("{s:s%}", "text", text, len);
        char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
        if (s)
            printf("%s\n", s);
        else
            rc = 1;
        free(s);
        json_decref(o);
    } else {
        fwrite(text, 1, len, stdout);
        putchar('\n');
    }
    free(text);
    free(ids);
    dflash_tokenizer_free(tok);
    return cli_finish_stdout(rc);
}
