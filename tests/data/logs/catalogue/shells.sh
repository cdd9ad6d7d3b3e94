# How shell-bus-error.log, shell-fpe.log and cpp-terminate.log were made (bash 5.2, g++ 12, this machine):
#   printf '%s\n' "python -c 'import os,signal; print(\"step 1\", flush=True); os.kill(os.getpid(), signal.SIGBUS)'" \
#       'echo "exit code $?"' > job_BUS.sh && bash job_BUS.sh > shell-bus-error.log 2>&1   # (SIGFPE: shell-fpe.log)
#   g++ -o term cpp_terminate.cc && ./term > cpp-terminate.log 2>&1
# bash reports a child's death by a signal as "job_BUS.sh: line 1: PID Bus error   COMMAND" (jobs.c); libstdc++'s
# std::terminate prints "terminate called after throwing an instance of 'T'" and "  what():  ...".
