"""The six realistic JSON schemas the script measures, each with one valid instance (properties in schema
order), and OpenAI's `json_object` mode: the grammars behind the compile, fill, overlap and smoke sections,
kept apart because they are data, most of the script's lines, and the same for every section.
"""

from __future__ import annotations

from typing import Any

# ----------------------------------------------------------------------------------------------------------
# Schemas: six realistic ones (each with one valid instance, properties in schema order) and json_object.

SCHEMAS: dict[str, dict[str, Any]] = {
    # an OpenAI-style extraction answer: arrays of objects, enums, nullable bounded integers, no extras
    "extraction": {
        "type": "object",
        "properties": {
            "people": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "role": {"type": "string", "enum": ["author", "editor", "reviewer", "subject", "other"]},
                        "age": {"type": ["integer", "null"], "minimum": 0, "maximum": 150},
                    },
                    "required": ["name", "role", "age"],
                    "additionalProperties": False,
                },
            },
            "organisations": {"type": "array", "items": {"type": "string"}},
            "summary": {"type": "string"},
            "sentiment": {"type": "string", "enum": ["positive", "neutral", "negative"]},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["people", "organisations", "summary", "sentiment", "confidence"],
        "additionalProperties": False,
    },
    # the arguments of a tool call: bounded integers and numbers, enums, optional fields, a nested object
    "tool_call": {
        "type": "object",
        "properties": {
            "origin": {"type": "string", "minLength": 3, "maxLength": 3},
            "destination": {"type": "string", "minLength": 3, "maxLength": 3},
            "departure_date": {"type": "string"},
            "return_date": {"type": ["string", "null"]},
            "passengers": {
                "type": "object",
                "properties": {
                    "adults": {"type": "integer", "minimum": 1, "maximum": 9},
                    "children": {"type": "integer", "minimum": 0, "maximum": 8},
                },
                "required": ["adults"],
                "additionalProperties": False,
            },
            "cabin": {"type": "string", "enum": ["economy", "premium_economy", "business", "first"]},
            "max_price": {"type": "number", "minimum": 0},
            "nonstop_only": {"type": "boolean"},
        },
        "required": ["origin", "destination", "departure_date", "passengers", "cabin"],
        "additionalProperties": False,
    },
    # a product catalogue item: nested optional object, arrays of objects, bounded numbers
    "catalogue_item": {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 1},
            "name": {"type": "string", "minLength": 1, "maxLength": 120},
            "price": {"type": "number", "minimum": 0},
            "currency": {"type": "string", "enum": ["EUR", "USD", "GBP", "JPY", "CHF"]},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
            "dimensions": {
                "type": "object",
                "properties": {
                    "length_cm": {"type": "number", "minimum": 0},
                    "width_cm": {"type": "number", "minimum": 0},
                    "height_cm": {"type": "number", "minimum": 0},
                },
                "required": ["length_cm", "width_cm", "height_cm"],
                "additionalProperties": False,
            },
            "in_stock": {"type": "boolean"},
            "variants": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": {"type": "string"},
                        "colour": {"type": "string", "enum": ["black", "white", "red", "green", "blue"]},
                        "size": {"type": "string", "enum": ["XS", "S", "M", "L", "XL"]},
                        "stock": {"type": "integer", "minimum": 0},
                    },
                    "required": ["sku", "colour", "size", "stock"],
                    "additionalProperties": False,
                },
                "minItems": 1,
            },
            "rating": {"type": "number", "minimum": 0, "maximum": 5},
        },
        "required": ["id", "name", "price", "currency", "in_stock", "variants"],
        "additionalProperties": False,
    },
    # an address book: arrays of objects holding arrays of objects, optional nested objects
    "address_book": {
        "type": "object",
        "properties": {
            "owner": {"type": "string"},
            "contacts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "emails": {"type": "array", "items": {"type": "string"}},
                        "phones": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "kind": {"type": "string", "enum": ["mobile", "home", "work"]},
                                    "number": {"type": "string"},
                                },
                                "required": ["kind", "number"],
                                "additionalProperties": False,
                            },
                        },
                        "address": {
                            "type": "object",
                            "properties": {
                                "street": {"type": "string"},
                                "city": {"type": "string"},
                                "postal_code": {"type": "string"},
                                "country": {"type": "string"},
                            },
                            "required": ["street", "city", "country"],
                            "additionalProperties": False,
                        },
                        "favourite": {"type": "boolean"},
                    },
                    "required": ["name", "emails", "phones"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["owner", "contacts"],
        "additionalProperties": False,
    },
    # a list of calendar entries, each one of two shapes told apart by a const (anyOf)
    "agenda_anyof": {
        "type": "object",
        "properties": {
            "entries": {
                "type": "array",
                "items": {
                    "anyOf": [
                        {
                            "type": "object",
                            "properties": {
                                "kind": {"const": "event"},
                                "title": {"type": "string"},
                                "start": {"type": "string"},
                                "end": {"type": "string"},
                                "attendees": {"type": "array", "items": {"type": "string"}},
                            },
                            "required": ["kind", "title", "start", "end"],
                            "additionalProperties": False,
                        },
                        {
                            "type": "object",
                            "properties": {
                                "kind": {"const": "task"},
                                "title": {"type": "string"},
                                "priority": {"type": "integer", "minimum": 1, "maximum": 5},
                                "done": {"type": "boolean"},
                            },
                            "required": ["kind", "title", "priority", "done"],
                            "additionalProperties": False,
                        },
                    ]
                },
            },
            "timezone": {"type": "string"},
        },
        "required": ["entries", "timezone"],
        "additionalProperties": False,
    },
    # an order with $defs / $ref (an address used twice), nullable notes, an enum status
    "order_refs": {
        "$defs": {
            "address": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "street": {"type": "string"},
                    "city": {"type": "string"},
                    "country": {"type": "string", "enum": ["DE", "FR", "GB", "US", "JP"]},
                },
                "required": ["name", "street", "city", "country"],
                "additionalProperties": False,
            },
            "line": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string"},
                    "quantity": {"type": "integer", "minimum": 1},
                    "unit_price": {"type": "number", "minimum": 0},
                },
                "required": ["sku", "quantity", "unit_price"],
                "additionalProperties": False,
            },
        },
        "type": "object",
        "properties": {
            "order_id": {"type": "string"},
            "status": {"type": "string", "enum": ["pending", "paid", "shipped", "cancelled"]},
            "billing": {"$ref": "#/$defs/address"},
            "shipping": {"$ref": "#/$defs/address"},
            "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}, "minItems": 1},
            "notes": {"type": ["string", "null"]},
        },
        "required": ["order_id", "status", "billing", "shipping", "lines", "notes"],
        "additionalProperties": False,
    },
}
JSON_OBJECT = "json_object"  # OpenAI's response_format {"type": "json_object"}: any JSON object

INSTANCES: dict[str, Any] = {
    "extraction": {
        "people": [{"name": "Ada Lovelace", "role": "author", "age": 36},
                   {"name": "Charles Babbage", "role": "subject", "age": None}],
        "organisations": ["Analytical Society", "Royal Society"],
        "summary": "Notes on the Analytical Engine, with a translation of Menabrea's memoir.",
        "sentiment": "positive",
        "confidence": 0.92,
    },
    "tool_call": {
        "origin": "CDG", "destination": "NRT", "departure_date": "2027-03-14", "return_date": None,
        "passengers": {"adults": 2, "children": 1}, "cabin": "premium_economy", "max_price": 1450.5,
        "nonstop_only": True,
    },
    "catalogue_item": {
        "id": 48213, "name": "Merino wool crew-neck sweater", "price": 89.9, "currency": "EUR",
        "tags": ["knitwear", "wool", "winter"],
        "dimensions": {"length_cm": 70, "width_cm": 52.5, "height_cm": 2},
        "in_stock": True,
        "variants": [{"sku": "MW-CN-BLK-M", "colour": "black", "size": "M", "stock": 14},
                     {"sku": "MW-CN-BLU-L", "colour": "blue", "size": "L", "stock": 3}],
        "rating": 4.6,
    },
    "address_book": {
        "owner": "Grace Hopper",
        "contacts": [
            {"name": "Alan Turing", "emails": ["alan@example.org"],
             "phones": [{"kind": "work", "number": "+44 20 7946 0018"}],
             "address": {"street": "Bletchley Park", "city": "Milton Keynes", "postal_code": "MK3 6EB",
                         "country": "United Kingdom"},
             "favourite": True},
            {"name": "Katherine Johnson", "emails": [], "phones": [{"kind": "mobile", "number": "+1 757 555 0101"}]},
        ],
    },
    "agenda_anyof": {
        "entries": [
            {"kind": "event", "title": "Design review", "start": "2027-01-12T10:00", "end": "2027-01-12T11:00",
             "attendees": ["li", "sam"]},
            {"kind": "task", "title": "Write the release notes", "priority": 2, "done": False},
        ],
        "timezone": "Europe/Paris",
    },
    "order_refs": {
        "order_id": "A-10023", "status": "paid",
        "billing": {"name": "M. Curie", "street": "11 rue Pierre et Marie Curie", "city": "Paris", "country": "FR"},
        "shipping": {"name": "M. Curie", "street": "11 rue Pierre et Marie Curie", "city": "Paris", "country": "FR"},
        "lines": [{"sku": "LAB-COAT-M", "quantity": 2, "unit_price": 39.0},
                  {"sku": "GOGGLES", "quantity": 1, "unit_price": 12.5}],
        "notes": None,
    },
    JSON_OBJECT: {"id": 7, "tags": ["a", "b"], "nested": {"ok": True, "ratio": 0.25, "none": None}, "text": "hi"},
}
ALL_GRAMMARS = (*SCHEMAS, JSON_OBJECT)
