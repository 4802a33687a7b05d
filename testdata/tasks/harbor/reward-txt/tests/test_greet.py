from greet import greet


def test_greets_by_name():
    assert greet("Ada") == "Hello, Ada!"


def test_greets_anyone():
    assert greet("world") == "Hello, world!"
