"""Sources: where events come from. ``files`` tails globs of files; ``sock`` listens on a unix
stream socket; ``events`` takes the event time and key out of JSON lines when configured."""
