def read(): pass
