"""Double of pycompss.api.constraint with the runtime's checks."""

from __future__ import annotations

from pycompss import runtime

# Top-level keys the runtime knows; matched case- and underscore-insensitively.
_KNOWN = {
    "computingunits", "processorname", "processorspeed", "processorarchitecture",
    "processortype", "processorpropertyname", "processorpropertyvalue",
    "processorinternalmemorysize", "processors", "memorysize", "memorytype",
    "storagesize", "storagetype", "storagebw", "operatingsystemtype",
    "operatingsystemdistribution", "operatingsystemversion", "wallclocklimit",
    "hostqueues", "appsoftware",
}
_PROCESSOR_KEYS = {
    "processorType", "computingUnits", "name", "speed", "architecture",
    "internalMemorySize", "propertyName", "propertyValue",
}


def _check(kwargs: dict) -> None:
    for key, value in kwargs.items():
        if key.replace("_", "").lower() not in _KNOWN:
            raise RuntimeError(f"COMPSs aborts: unknown constraint {key!r}")
        _literal(key, value)
    for processor in kwargs.get("processors", []):
        unknown = set(processor) - _PROCESSOR_KEYS
        if unknown:
            raise RuntimeError(f"COMPSs aborts: unknown processor keys {sorted(unknown)}")
        for key, value in processor.items():
            _literal(key, value)
        if processor.get("processorType") not in ("CPU", "GPU", "FPGA", "OTHER"):
            raise RuntimeError(f"COMPSs aborts: bad processorType in {processor}")


def _literal(key: str, value) -> None:
    # binding.register_ce writes ints, strings and lists; anything else is refused.
    if isinstance(value, (float, bool)):
        raise RuntimeError(f"COMPSs aborts: constraint {key}={value!r} must be an int or a string")


class Constraint:
    def __init__(self, *args, **kwargs) -> None:
        _check(kwargs)
        self.kwargs = kwargs

    def __call__(self, user_function):
        runtime.declared.setdefault(user_function.__name__, {})["constraint"] = self.kwargs
        user_function.__compss_constraints__ = self.kwargs
        return user_function


constraint = Constraint
