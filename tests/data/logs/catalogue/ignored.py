"""How exception-ignored.log was made (python ignored.py > exception-ignored.log 2>&1): a job that finished, then an
exception in a destructor at exit, which Python prints after "Exception ignored in:" and ignores (exit code 0)."""


class Loader:
    def __del__(self) -> None:
        raise AttributeError("'Loader' object has no attribute '_workers_status'")


loader = Loader()
print("step 100 loss 0.1", flush=True)
print("training done", flush=True)
