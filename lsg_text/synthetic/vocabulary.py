"""The synthetic set's closed vocabulary: the key words of every variant and the sentence templates
that carry them. None of these words occurs in filler (:mod:`lsg_text.synthetic.filler`; checked in
tests), so a key is found by its words alone."""

COLOURS = ("red", "blue", "green", "yellow", "purple", "orange", "black", "white", "grey", "brown", "pink", "silver")
ANIMALS = (
    "fox",
    "owl",
    "bear",
    "wolf",
    "deer",
    "hare",
    "otter",
    "eagle",
    "badger",
    "heron",
    "lynx",
    "moose",
    "raven",
    "seal",
    "tiger",
    "camel",
)
CITIES = (
    "Paris",
    "Lisbon",
    "Oslo",
    "Cairo",
    "Lima",
    "Dublin",
    "Vienna",
    "Prague",
    "Madrid",
    "Athens",
    "Quito",
    "Tokyo",
    "Nairobi",
    "Boston",
    "Sydney",
    "Berlin",
)
NAMES = (
    "Nora",
    "Pim",
    "Otto",
    "Lena",
    "Ivo",
    "Mira",
    "Tess",
    "Bram",
    "Cato",
    "Edda",
    "Finn",
    "Hana",
    "Juno",
    "Kai",
    "Lars",
    "Rosa",
)
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")

KEY_TEMPLATE = "The {colour} {animal} visited {city} on {weekday}."
KEY_TOKENS = len(KEY_TEMPLATE.split())  # 7

BIND_TEMPLATE = "The {colour} {animal} is called {name}."
USE_TEMPLATE = "{name} visited {city} on {weekday}."
DECOY_TEMPLATE = "{name} avoided {city} on {weekday}."
MENTION_TEMPLATE = "A {animal} was seen."
COUNT_TEMPLATE = "The {animal} was seen {count} times."
MAX_COUNT = 4
ARRIVE_TEMPLATE = "The {animal} arrived."
ORDER_TEMPLATE = "The {first} arrived before the {second}."
