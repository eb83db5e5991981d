// Reads one integer out of an object's JSON, for the SDK's own needs, without a JSON library.
package io.consistd.client;

import java.util.OptionalLong;

/**
 * Finds the integer at a path of object members ("metadata", "generation") in a JSON text, skipping everything
 * else: the SDK hands objects to the app as JSON text for its own JSON library and takes none itself, but a {@link
 * WorkItem#setCondition} needs the handed object's metadata.generation. The first member of a name counts (the
 * apiserver never repeats one); a path that is missing, leads through something other than an object, or ends on
 * anything but an integer that fits a long, and text that is not JSON, find nothing.
 */
final class JsonFields {
  private final String text;
  private int at;

  private JsonFields(String text) {
    this.text = text;
  }

  /** The integer at {@code path} in {@code json}; empty when there is none. */
  static OptionalLong integer(String json, String... path) {
    if (json == null) {
      return OptionalLong.empty();
    }
    try {
      return new JsonFields(json).find(path, 0);
    } catch (IllegalArgumentException | IndexOutOfBoundsException e) {
      return OptionalLong.empty();
    }
  }

  /** The value here, the member path[depth] of an object, or the integer itself once the path is walked. */
  private OptionalLong find(String[] path, int depth) {
    space();
    if (depth == path.length) {
      return integer();
    }
    if (text.charAt(at) != '{') {
      return OptionalLong.empty();
    }
    at++;
    space();
    if (text.charAt(at) == '}') {
      return OptionalLong.empty();
    }
    while (true) {
      space();
      String name = string();
      space();
      expect(':');
      if (name.equals(path[depth])) {
        return find(path, depth + 1);
      }
      skipValue();
      space();
      char c = text.charAt(at++);
      if (c == '}') {
        return OptionalLong.empty();
      }
      if (c != ',') {
        throw new IllegalArgumentException("expected , or }");
      }
    }
  }

  /** An integer, ending where a number ends; a fraction or an exponent is none. */
  private OptionalLong integer() {
    int start = at;
    if (at < text.length() && text.charAt(at) == '-') {
      at++;
    }
    while (at < text.length() && text.charAt(at) >= '0' && text.charAt(at) <= '9') {
      at++;
    }
    boolean ends = at == text.length() || ",}] \t\r\n".indexOf(text.charAt(at)) >= 0;
    if (!ends || at == start || text.charAt(at - 1) == '-') {
      return OptionalLong.empty();
    }
    try {
      return OptionalLong.of(Long.parseLong(text, start, at, 10));
    } catch (NumberFormatException e) {
      return OptionalLong.empty();
    }
  }

  /** A string, unescaped; the position moves past its closing quote. */
  private String string() {
    expect('"');
    StringBuilder out = new StringBuilder();
    while (true) {
      char c = text.charAt(at++);
      if (c == '"') {
        return out.toString();
      }
      if (c != '\\') {
        out.append(c);
        continue;
      }
      char escaped = text.charAt(at++);
      switch (escaped) {
        case '"', '\\', '/' -> out.append(escaped);
        case 'b' -> out.append('\b');
        case 'f' -> out.append('\f');
        case 'n' -> out.append('\n');
        case 'r' -> out.append('\r');
        case 't' -> out.append('\t');
        case 'u' -> {
          out.append((char) Integer.parseInt(text, at, at + 4, 16));
          at += 4;
        }
        default -> throw new IllegalArgumentException("bad escape");
      }
    }
  }

  /** Moves past one value of any kind, without recursion (an object of any depth is counted through). */
  private void skipValue() {
    space();
    char c = text.charAt(at);
    if (c == '"') {
      string();
      return;
    }
    if (c != '{' && c != '[') {
      while (at < text.length() && ",}] \t\r\n".indexOf(text.charAt(at)) < 0) {
        at++;
      }
      return;
    }
    int depth = 0;
    do {
      c = text.charAt(at);
      if (c == '"') {
        string();
        continue;
      }
      if (c == '{' || c == '[') {
        depth++;
      } else if (c == '}' || c == ']') {
        depth--;
      }
      at++;
    } while (depth > 0);
  }

  private void expect(char c) {
    if (text.charAt(at++) != c) {
      throw new IllegalArgumentException("expected " + c);
    }
  }

  private void space() {
    while (at < text.length() && " \t\r\n".indexOf(text.charAt(at)) >= 0) {
      at++;
    }
  }
}
