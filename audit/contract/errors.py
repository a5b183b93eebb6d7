"""Named failures of the audit package; the CLI turns each into one clear line and a hint."""


class AuditError(Exception):
    hint: str = ""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.hint = hint


class MalformedRecord(AuditError):
    """A record on the audit topic that does not follow the contract: skipped and counted."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
