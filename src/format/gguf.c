/* placeholder: the GGUF reader is being written (see gguf.h) */
#include "format/gguf.h"
