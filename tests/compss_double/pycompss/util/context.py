"""Double of pycompss.util.context: where the code runs (3.x CONTEXT object)."""


class _Context:
    master, worker, out_of_scope = "MASTER", "WORKER", "OUT_OF_SCOPE"

    def __init__(self):
        self.where = self.out_of_scope

    def in_master(self) -> bool:
        return self.where == self.master

    def in_worker(self) -> bool:
        return self.where == self.worker

    def in_pycompss(self) -> bool:
        return self.where != self.out_of_scope


CONTEXT = _Context()
