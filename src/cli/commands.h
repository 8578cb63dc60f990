/*
 * commands.h — the qwenrt sub-commands. Each lives in its own src/cli/cmd_<name>.c and takes
 * the arguments after its name; it returns the process exit code (0 ok, 1 failure, 2 usage).
 */
#ifndef QWENRT_CLI_COMMANDS_H
#define QWENRT_CLI_COMMANDS_H

int cmd_info(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_compare(int argc, char **argv);
int cmd_validate(int argc, char **argv);
int cmd_profile(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_card(int argc, char **argv);
int cmd_serve(int argc, char **argv);

#endif
