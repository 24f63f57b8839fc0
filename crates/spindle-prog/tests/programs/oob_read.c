#include "spindle_prog.h"
/* Reads past the end of the object. */
uint64_t spindle_main(const struct spindle_input *in) {
    return in->data[in->data_len + 4096];
}
