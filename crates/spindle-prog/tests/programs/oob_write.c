#include "spindle_prog.h"
/* Writes into the object, which is read-only. */
uint64_t spindle_main(const struct spindle_input *in) {
    ((uint8_t *)in->data)[0] = 1;
    return 0;
}
