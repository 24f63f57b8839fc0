#include "spindle_prog.h"
/* Asks a helper to read memory it does not have. */
uint64_t spindle_main(const struct spindle_input *in) {
    return spindle_emit((const void *)0x100, 1 << 20);
}
