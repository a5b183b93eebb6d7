"""Topic and key templates over an event's fields (``agent/routing.py``)."""

from agent.routing import Template


def test_a_template_renders_its_fields_and_refuses_what_is_absent_or_null():
    t = Template("logs.{facility}.{app}")
    assert t.fields == ("facility", "app")
    assert t.render({"facility": "local3", "app": "billing"}) == "logs.local3.billing"
    assert t.render({"facility": "local3"}) is None
    assert t.render({"facility": "local3", "app": None}) is None
    assert Template("{n}-{b}").render({"n": 7, "b": True}) == "7-true"
    assert Template("static").is_static and not t.is_static


def test_a_topic_must_be_a_name_kafka_takes():
    t = Template("logs.{app}")
    assert t.topic({"app": "cron"}) == "logs.cron"
    assert t.topic({"app": "my app"}) is None              # a space
    assert t.topic({"app": "a/b"}) is None
    assert t.topic({"app": "x" * 250}) is None              # over 249 characters
