"""module_utils/vca_rabbitmq: the hash check and the plan that library/vca_rabbitmq_users acts on
(molecule/farm proves it against a real broker)."""

import base64

from ansible.module_utils.vca_rabbitmq import import_document, password_hash, password_matches, plan

RIGHTS = {"configure": "^a$", "write": "^a$", "read": "^a$"}


def exported(name, password, **extra):
    return {"name": name, "password_hash": password_hash(password), "tags": [],
            "hashing_algorithm": "rabbit_password_hashing_sha256", **extra}


def broker(*users, perms=(), vhosts=("farm",)):
    return {"users": list(users), "permissions": list(perms), "vhosts": [{"name": v} for v in vhosts]}


def test_a_hash_rabbitmq_made_is_checked_by_content():
    # made by RabbitMQ 3.10.8 (rabbitmqctl add_user u secret, then export_definitions)
    made = {"hashing_algorithm": "rabbit_password_hashing_sha256",
            "password_hash": "zHzgQeqNz3K3Ej6DYiNKiUeAEC5/vkkSrQGNQ4aW/Vd6ONbc"}
    assert password_hash("secret", base64.b64decode(made["password_hash"])[:4]) == made["password_hash"]
    assert password_matches(made, "secret")
    assert not password_matches(made, "secreT")
    assert not password_matches({**made, "hashing_algorithm": "rabbit_password_hashing_md5"}, "secret")
    assert not password_matches({**made, "password_hash": "not base64!"}, "secret")


def test_nothing_to_do_when_the_broker_holds_exactly_the_users():
    want = [{"name": "farm-n0", "password": "p0", **RIGHTS}]
    have = broker(exported("farm-n0", "p0"), perms=[{"user": "farm-n0", "vhost": "farm", **RIGHTS}])
    todo = plan(have, "farm", want, managed_prefix="farm-", absent=["guest"])
    assert todo == {"vhost": False, "put": [], "clear": [], "delete": []}


def test_each_difference_is_found():
    want = [{"name": "farm-n0", "password": "p0", **RIGHTS}, {"name": "farm-n1", "password": "p1", **RIGHTS},
            {"name": "farm-n2", "password": "p2", **RIGHTS}, {"name": "farm", "password": "f", **RIGHTS}]
    have = broker(
        exported("farm-n0", "changed by hand"),                      # wrong password
        exported("farm-n1", "p1"),                                   # rights too wide, and on another vhost
        exported("farm", "f", tags=["administrator"]),               # a tag it must not have
        exported("farm-old", "x"), exported("guest", "guest"), exported("admin", "a"),
        perms=[{"user": "farm-n1", "vhost": "farm", "configure": ".*", "write": "^a$", "read": "^a$"},
               {"user": "farm-n1", "vhost": "/", **RIGHTS},
               {"user": "farm-n0", "vhost": "farm", **RIGHTS}, {"user": "farm", "vhost": "farm", **RIGHTS}],
        vhosts=("/",))
    todo = plan(have, "farm", want, managed_prefix="farm-", absent=["guest"])
    assert todo["vhost"] is True
    assert todo["put"] == ["farm-n0", "farm-n1", "farm-n2", "farm"]   # farm-n2: missing
    assert todo["clear"] == [("/", "farm-n1")]
    assert todo["delete"] == ["farm-old", "guest"]                    # admin: not managed, kept
    # a live node whose rights could not be read (a check run): its user is kept, not deleted
    assert plan(have, "farm", want, managed_prefix="farm-", keep=["farm-old"])["delete"] == []


def test_the_import_carries_hashes_not_passwords():
    want = [{"name": "farm-n0", "password": "p0", **RIGHTS}, {"name": "farm-n1", "password": "p1", **RIGHTS}]
    doc = import_document("farm", want, {"farm-n1"})
    assert [u["name"] for u in doc["users"]] == ["farm-n1"]
    assert "p1" not in str(doc) and password_matches(doc["users"][0], "p1")
    assert doc["permissions"] == [{"user": "farm-n1", "vhost": "farm", **RIGHTS}]
