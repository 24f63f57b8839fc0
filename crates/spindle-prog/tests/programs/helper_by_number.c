#include "spindle_prog.h"
/* A Linux-style helper call by number. */
static int64_t (*bpf_helper_6)(const char *, uint64_t) = (void *)6;
uint64_t spindle_main(const struct spindle_input *in) {
    return bpf_helper_6("hi", 2);
}
