/* `forkbox run` (run_cmd.c): the forkbox binary's command that runs Python
 * files as one turn in a local sandbox, through the Python host. */
#pragma once

/* argv[0] is "run", argv[1..argc) its arguments. Execs the Python host and
 * so returns only on failure, with the exit status to use (125). */
int run_cmd_main(int argc, char **argv);
