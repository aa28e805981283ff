"""Sleep, then report; sleeping past the call budget fails the call as `deadline_exceeded`."""

import time


def _(p):
    time.sleep(p["seconds"])
    return {"slept": p["seconds"]}
