# dflash: plain Makefile. `make` builds $(B)/libdflash.a, $(B)/libdflash.so
# and $(B)/dflash; `make test` runs the whole suite (unit, sanitizers, fuzz
# smoke, parity, install); `make run` runs the main job on the embedded
# models; `make install` (PREFIX, default /usr/local, and DESTDIR) installs
# the libraries, include/dflash.h, dflash.pc for pkg-config and the CLI.
B       ?= build
CC      ?= gcc
CLANG   ?= clang
OPT     ?= -O2
CFLAGS  := -std=c11 $(OPT) -g -fopenmp -Wall -Wextra -Werror -MMD -MP -Iinclude -Isrc -D_GNU_SOURCE $(EXTRA_CFLAGS)
PREFIX  ?= /usr/local
VERSION := 0.1.0
LDLIBS  := -ljansson -lpcre2-8 -lutf8proc -ldl -lm
# the CLI's HTTP server (dflash serve)
CLI_LIBS := -lmicrohttpd -lpthread
SAN     := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

LIB_SRC := $(sort $(shell find src -name '*.c' ! -path 'src/cli/*'))
CLI_SRC := $(sort $(wildcard src/cli/*.c))
TEST_SRC := $(sort $(wildcard tests/test_*.c))
FUZZ_SRC := $(sort $(wildcard tests/fuzz/fuzz_*.c))

LIB_OBJ := $(LIB_SRC:%.c=$(B)/obj/%.o)
# libdflash.so is built from its own position-independent objects, so the
# static library and the CLI keep the plain ones
PIC_OBJ := $(LIB_SRC:%.c=$(B)/pic/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(B)/obj/%.o)
TEST_BIN := $(TEST_SRC:tests/%.c=$(B)/tests/%)
ASAN_OBJ := $(LIB_SRC:%.c=$(B)/asan/%.o)
ASAN_BIN := $(TEST_SRC:tests/%.c=$(B)/asan/tests/%)
ASAN_CLI_OBJ := $(CLI_SRC:%.c=$(B)/asan/%.o)
FUZZ_OBJ := $(LIB_SRC:%.c=$(B)/fuzz/%.o)
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/%.c=$(B)/fuzz/bin/%)

.PHONY: all deps test test-unit test-asan test-fuzz run clean format install
all: deps $(B)/dflash $(B)/libdflash.so

deps: $(B)/.deps-ok
$(B)/.deps-ok: tools/deps.sh
	@bash tools/deps.sh
	@mkdir -p $(B) && touch $@

$(B)/obj/%.o: %.c | $(B)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(B)/libdflash.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(B)/pic/%.o: %.c | $(B)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fPIC -c $< -o $@

$(B)/libdflash.so: $(PIC_OBJ)
	$(CC) -shared -fopenmp -o $@ $^ $(LDLIBS)

# dflash.pc is written at install time: it names the PREFIX given then.
install: all
	@printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$${prefix}/lib' 'includedir=$${prefix}/include' '' \
	  'Name: dflash' 'Description: DFlash speculative decoding (block-diffusion drafter, Qwen3 and Llama targets)' \
	  'Version: $(VERSION)' 'Requires.private: jansson libpcre2-8 libutf8proc' 'Libs: -L$${libdir} -ldflash' \
	  'Libs.private: -fopenmp -ldl -lm' 'Cflags: -I$${includedir}' > $(B)/dflash.pc
	install -D -m 644 include/dflash.h $(DESTDIR)$(PREFIX)/include/dflash.h
	install -D -m 644 $(B)/libdflash.a $(DESTDIR)$(PREFIX)/lib/libdflash.a
	install -D -m 755 $(B)/libdflash.so $(DESTDIR)$(PREFIX)/lib/libdflash.so
	install -D -m 644 $(B)/dflash.pc $(DESTDIR)$(PREFIX)/lib/pkgconfig/dflash.pc
	install -D -m 755 $(B)/dflash $(DESTDIR)$(PREFIX)/bin/dflash

$(B)/dflash: $(CLI_OBJ) $(B)/libdflash.a
	$(CC) $(CFLAGS) -o $@ $(CLI_OBJ) $(B)/libdflash.a $(LDLIBS) $(CLI_LIBS)

# The example, built as a user builds against the library: the public
# header only (no -Isrc), so it proves include/dflash.h is enough.
$(B)/examples/simple: examples/simple.c include/dflash.h $(B)/libdflash.a
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -Wall -Wextra -Werror -Iinclude -o $@ $< $(B)/libdflash.a -fopenmp $(LDLIBS)

$(B)/tests/%: tests/%.c $(B)/libdflash.a tests/harness.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(B)/libdflash.a $(LDLIBS)

# Sanitizer build of the library and the unit tests.
$(B)/asan/%.o: %.c | $(B)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(SAN) -c $< -o $@

$(B)/asan/libdflash.a: $(ASAN_OBJ)
	@rm -f $@
	ar rcs $@ $^

# The CLI under the sanitizers, for the command-line regression tests.
$(B)/asan/dflash: $(ASAN_CLI_OBJ) $(B)/asan/libdflash.a
	$(CC) $(CFLAGS) $(SAN) -o $@ $(ASAN_CLI_OBJ) $(B)/asan/libdflash.a $(LDLIBS) $(CLI_LIBS)

$(B)/asan/tests/%: tests/%.c $(B)/asan/libdflash.a tests/harness.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(SAN) -Itests -o $@ $< $(B)/asan/libdflash.a $(LDLIBS)

# libFuzzer builds (clang), run for a bounded time by `make test`.
$(B)/fuzz/%.o: %.c | $(B)/.deps-ok
	@mkdir -p $(dir $@)
	$(CLANG) -std=c11 -O1 -g -Iinclude -Isrc -D_GNU_SOURCE -fsanitize=fuzzer-no-link,address,undefined -c $< -o $@

$(B)/fuzz/bin/%: tests/fuzz/%.c $(FUZZ_OBJ)
	@mkdir -p $(dir $@)
	$(CLANG) -std=c11 -O1 -g -Iinclude -Isrc -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined -o $@ $< $(FUZZ_OBJ) $(LDLIBS) -fopenmp

# ThreadSanitizer build of the CPU linear and its thread pool (lock-free
# hand-over of jobs between threads: a race would be silent otherwise).
TSAN_SRC := tests/test_cpu_gemm.c src/backend/cpu/cpu_gemm.c src/backend/cpu/cpu_pool.c $(wildcard src/core/*.c)
$(B)/tsan/test_cpu_gemm: $(TSAN_SRC) tests/harness.h | $(B)/.deps-ok
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O1 -g -fsanitize=thread -Wall -Wextra -Werror -Iinclude -Isrc -Itests -D_GNU_SOURCE -o $@ $(TSAN_SRC) -ljansson -lm -lpthread

# The GPU machine's check programs (tools/gpu-test.sh builds and runs them
# there); built here too, so a change that breaks them fails the tests,
# not a device call.
GPU_TOOLS := $(B)/tools/cuda_ops_check $(B)/tools/cuda_model_check
$(B)/tools/%: tools/cuda/%.c $(B)/libdflash.a tests/harness.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(B)/libdflash.a $(LDLIBS)

# Benchmarks of host-side pieces (built by the tests so that they keep
# compiling; run by hand, see docs/perf-notes.md).
$(B)/tools/sampler_bench: tools/bench/sampler_bench.c $(B)/libdflash.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(B)/libdflash.a $(LDLIBS)

test: all $(TEST_BIN) $(ASAN_BIN) $(B)/asan/dflash $(FUZZ_BIN) $(B)/tsan/test_cpu_gemm $(B)/examples/simple $(GPU_TOOLS) \
      $(B)/tools/sampler_bench
	@B=$(B) bash tools/fetch-tokenizers.sh
	@B=$(B) bash tests/run.sh

run: all
	@bash tools/run-default.sh

format:
	clang-format -i $$(find src include tests -name '*.[ch]')

clean:
	rm -rf $(B)/obj $(B)/pic $(B)/asan $(B)/tsan $(B)/fuzz $(B)/tests $(B)/tools $(B)/examples $(B)/dflash $(B)/libdflash.a \
	  $(B)/libdflash.so $(B)/dflash.pc

-include $(shell find $(B) -name '*.d' 2>/dev/null)
.SECONDARY:

# The CPU reference ops are the hot loops: -O3 lets GCC vectorize the
# fixed-order partial sums (results are identical; the order is in the code).
$(B)/obj/src/backend/cpu/%.o: CFLAGS += -O3
$(B)/pic/src/backend/cpu/%.o: CFLAGS += -O3
