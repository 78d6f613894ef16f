def slug(s):
    # TODO:handle unicode
    return s.lower()
