"""User-facing errors: one line that says what is wrong and where."""


class EditscopeError(Exception):
    """An error caused by the user's input or environment; the CLI prints it as one line, no traceback."""

    #: the CLI's exit status when this error ends a command
    exit_code: int = 1


class DataError(EditscopeError, ValueError):
    """A malformed input record: message is ``file:record N: field X: what is wrong``."""

    def __init__(self, file: str, record: int | None, field: str | None, problem: str) -> None:
        where = str(file)
        if record is not None:
            where += f":record {record}"
        if field is not None:
            where += f": field {field}"
        super().__init__(f"{where}: {problem}")
        self.file, self.record, self.field, self.problem = file, record, field, problem
