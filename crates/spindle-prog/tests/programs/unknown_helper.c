#include "spindle_prog.h"
extern int64_t bpf_trace_printk(const char *fmt, uint64_t len);
uint64_t spindle_main(const struct spindle_input *in) {
    return bpf_trace_printk("hi", 2);
}
