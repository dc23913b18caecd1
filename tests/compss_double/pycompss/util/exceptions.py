"""Double of pycompss.util.exceptions: what a worker raises inside a task it
times out (SIGALRM) or cancels (SIGUSR2); both are ``Exception`` subclasses."""


class TimeOutError(Exception):
    pass


class CancelError(Exception):
    pass
