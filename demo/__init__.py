"""``make demo``: the whole docket pipeline on this machine (``demo.run``), fed by an
application writing rotated logs (``demo.generator``). Not installed with docket: it runs from
a checkout, with the checkout's virtualenv."""
